"""semigrad server: differentiates registered computation graphs over gRPC."""

__version__ = "0.1.0"
