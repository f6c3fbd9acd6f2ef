"""Graph files for the command line: a JSON object with "graph" (a semigrad.v1.Graph in the
protobuf JSON mapping), "inputs" (input name -> nested list of numbers, or a semigrad.v1.Tensor
in the JSON mapping) and command-specific options."""

from __future__ import annotations

import json
from typing import Collection

import numpy as np
from google.protobuf import json_format
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb

from ..ir import DTYPES
from .convert import graph_from_proto


class BadInput(Exception):
    """The file or the command line is wrong (commands exit with status 2)."""


def load_graph_file(path: str, *, keys: Collection[str], required: Collection[str], command: str) -> dict:
    """The file's graph (IR), inputs (arrays, in the declared dtypes) and other keys."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or any(key not in doc for key in required):
        wanted = " and ".join(f'"{k}"' for k in required)
        raise BadInput(f"{path}: expected an object with {wanted} (see `semigrad {command} --help`)")
    unknown = sorted(set(doc) - set(keys))
    if unknown:
        raise BadInput(f"{path}: unknown key '{unknown[0]}' (keys: {', '.join(sorted(keys))})")
    try:
        graph = graph_from_proto(json_format.ParseDict(doc["graph"], pb.Graph()))
    except json_format.ParseError as e:
        raise BadInput(f"{path}: \"graph\" is not a semigrad.v1.Graph: {e}") from None
    for key in ("inputs", "semiring_params"):
        if not isinstance(doc.get(key, {}), dict):
            raise BadInput(f"{path}: \"{key}\" must be an object")
    dtypes = {spec.name: DTYPES[spec.dtype] for spec in graph.inputs}
    inputs = {}
    for name, value in doc.get("inputs", {}).items():
        if not isinstance(value, dict):  # numbers: the client's rule, a value that would change is refused
            try:
                inputs[name] = codec.cast(value, dtypes.get(name, np.float64), f"input '{name}'")
            except (ValueError, TypeError, OverflowError) as e:
                raise BadInput(f"{path}: {e}") from None
            continue
        try:
            inputs[name] = codec.from_tensor(json_format.ParseDict(value, pb.Tensor()))
        except (json_format.ParseError, ValueError, TypeError) as e:
            raise BadInput(f"{path}: input '{name}': {e}") from None
    return {**doc, "graph": graph, "inputs": inputs}
