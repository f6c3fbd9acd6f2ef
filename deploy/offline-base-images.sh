#!/usr/bin/env bash
# Stand-ins for the three base images the deploy files use -- python:3.11-slim (Dockerfile),
# redis:7 and haproxy:2.6 (deploy/docker-compose.yml) -- built from Debian bookworm's packages,
# for machines that reach a Debian mirror and PyPI but not Docker Hub. This is how this project's
# deploy files were run (docs/deploying.md); with Docker Hub, use the real images and skip this.
#
#   deploy/offline-base-images.sh [--force] [--network MODE] [--ca-certificates DIR]
#
# Needs root (debootstrap) and a running Docker engine. Each image is tagged exactly as the deploy
# files name it, so they run unchanged, and labelled org.semigrad.stand-in=bookworm. An image of
# that tag that is not a stand-in (a real one pulled earlier) is left alone unless --force.
# --network MODE is given to `docker build` (e.g. host, when the default bridge cannot resolve
# names); the same can be set with STANDIN_BUILD_NETWORK. MIRROR (default deb.debian.org) is the
# Debian mirror. The python stand-in also trusts the certificates (*.crt) of --ca-certificates DIR,
# by default this host's own additions, /usr/local/share/ca-certificates (where a TLS-inspecting
# egress proxy's CA goes: without it pip in `docker build` fails CERTIFICATE_VERIFY_FAILED);
# `--ca-certificates ''` adds none. What each stand-in keeps of its official image is written
# beside it below.
set -euo pipefail

MIRROR=${MIRROR:-http://deb.debian.org/debian}
NETWORK=${STANDIN_BUILD_NETWORK:-}
CA_DIR=/usr/local/share/ca-certificates
FORCE=0
while [ $# -gt 0 ]; do
  case $1 in
    --force) FORCE=1 ;;
    --network) NETWORK=$2; shift ;;
    --network=*) NETWORK=${1#--network=} ;;
    --ca-certificates) CA_DIR=$2; shift ;;
    --ca-certificates=*) CA_DIR=${1#--ca-certificates=} ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

LABEL=org.semigrad.stand-in
BASE=debian-local:bookworm
build_args=()
[ -n "$NETWORK" ] && build_args+=(--network "$NETWORK")

# 0 when TAG should be (re)built: absent, or ours, or --force.
should_build() {
  local tag=$1 label
  docker image inspect "$tag" >/dev/null 2>&1 || return 0
  label=$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$tag")
  if [ -z "$label" ] && [ "$FORCE" = 0 ]; then
    echo "$tag exists and is not a stand-in (a real image?): kept; --force replaces it" >&2
    return 1
  fi
  return 0
}

# The base: a minimal bookworm root file system, imported as an image (built once; --force redoes it).
if ! docker image inspect "$BASE" >/dev/null 2>&1 || [ "$FORCE" = 1 ]; then
  command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR"
  cat > "$work/rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
  rm -rf "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/cache/apt/*.bin "$work"/rootfs/var/cache/apt/archives/*.deb
  tar -C "$work/rootfs" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    -c 'CMD ["bash"]' - "$BASE"
fi

# Builds image TAG from the Dockerfile on standard input, in build context CONTEXT (default none).
build() {
  local tag=$1 context=${2:-}
  if [ -n "$context" ]; then
    docker build "${build_args[@]}" --label "$LABEL=bookworm" -t "$tag" -f - "$context"
  else
    docker build "${build_args[@]}" --label "$LABEL=bookworm" -t "$tag" -
  fi
}

# python:3.11-slim -- Debian's python3.11 as `python`/`python3` and pip usable system-wide (the
# official image's pip installs into the system Python; Debian's marks it externally managed,
# PEP 668, so that marker goes), with CA certificates (and --ca-certificates'), LANG=C.UTF-8,
# CMD python3.
if should_build python:3.11-slim; then
  context=$(mktemp -d)
  mkdir "$context/ca"
  if [ -n "$CA_DIR" ] && compgen -G "$CA_DIR/*.crt" >/dev/null; then
    cp "$CA_DIR"/*.crt "$context/ca/"
    echo "python:3.11-slim will trust, beside Debian's CAs: $(cd "$context/ca" && echo *.crt)"
  fi
  build python:3.11-slim "$context" <<'EOF'
FROM debian-local:bookworm
RUN export DEBIAN_FRONTEND=noninteractive && apt-get update -q \
    && apt-get install -y -q --no-install-recommends python3.11 python3-pip python-is-python3 \
       ca-certificates netbase tzdata \
    && rm -rf /var/lib/apt/lists/* /usr/lib/python3.11/EXTERNALLY-MANAGED \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip \
    && python --version && pip --version
COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates
ENV LANG=C.UTF-8
CMD ["python3"]
EOF
  rm -rf "$context"
fi

# redis:7 -- Debian's redis-server 7.0 run as user redis in /data. The official image compiles
# protected mode off (it would refuse every other container when no password is set); Debian's
# has it on, so the entrypoint adds `--protected-mode no` to redis-server's arguments unless they
# (or a configuration file given first) set protected-mode themselves.
# As the official entrypoint, arguments that start with "-" are redis-server's.
if should_build redis:7; then
  build redis:7 <<'EOF'
FROM debian-local:bookworm
RUN export DEBIAN_FRONTEND=noninteractive && apt-get update -q \
    && apt-get install -y -q --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data \
    && printf '%s\n' '#!/bin/sh' 'set -e' \
       'case "$1" in -*) set -- redis-server "$@" ;; esac' \
       'if [ "$1" = redis-server ]; then' \
       '  case " $* " in *" --protected-mode "*|*" -v "*|*" --version "*|*" -h "*|*" --help "*|*" --test-memory "*) ;;' \
       '    *) if [ -z "${2:-}" ] || [ "${2#-}" != "$2" ] || ! grep -qs "^ *protected-mode" "$2"; then' \
       '         set -- "$@" --protected-mode no; fi ;;' \
       '  esac' \
       'fi' \
       'exec "$@"' > /usr/local/bin/docker-entrypoint.sh \
    && chmod +x /usr/local/bin/docker-entrypoint.sh
VOLUME /data
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["redis-server"]
EOF
fi

# haproxy:2.6 -- Debian's haproxy 2.6 (with the Prometheus exporter), run as user haproxy; the
# configuration goes in /usr/local/etc/haproxy/haproxy.cfg. The official entrypoint runs
# `haproxy -W -db -f /usr/local/etc/haproxy/haproxy.cfg` (master-worker, foreground) and stops
# gracefully on SIGUSR1; so does this one.
if should_build haproxy:2.6; then
  build haproxy:2.6 <<'EOF'
FROM debian-local:bookworm
RUN export DEBIAN_FRONTEND=noninteractive && apt-get update -q \
    && apt-get install -y -q --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /usr/local/etc/haproxy /var/lib/haproxy && chown haproxy:haproxy /var/lib/haproxy \
    && haproxy -vv | grep -q PROMEX \
    && printf '%s\n' '#!/bin/sh' 'set -e' \
       'case "$1" in -*) set -- haproxy "$@" ;; esac' \
       'if [ "$1" = haproxy ]; then shift; set -- haproxy -W -db "$@"; fi' \
       'exec "$@"' > /usr/local/bin/docker-entrypoint.sh \
    && chmod +x /usr/local/bin/docker-entrypoint.sh
STOPSIGNAL SIGUSR1
USER haproxy
WORKDIR /var/lib/haproxy
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["haproxy", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
EOF
fi

# A rebuilt stand-in leaves its previous image untagged: remove those (only this script's).
docker image prune -f --filter "label=$LABEL" >/dev/null
docker image ls --filter "label=$LABEL" --filter dangling=false --format '{{.Repository}}:{{.Tag}}  {{.Size}}'
