"""The engine behind the service, one job per module:

  engine          Engine: registration, and requests answered with fresh forward passes
  specs           typed requests (EvaluateSpec, GradientSpec with `is_plain`, HookRequest)
  graphs          registered graphs (CompiledGraph, compile_graph) and the checks needing only the graph
  gradient_plans  a gradient request's backward graph, compiled to one plan
  remembered      plain requests already checked: the short path's memory
  execution       backend choice, work limit and time bound of one run
  results         plan results turned into the arrays a request gets back
"""

from .engine import Engine
from .graphs import Batch, CompiledGraph, compile_graph
from .results import GradientResult
from .specs import EvaluateSpec, GradientSpec, HookRequest

__all__ = ["Engine", "Batch", "CompiledGraph", "compile_graph", "GradientResult", "EvaluateSpec", "GradientSpec",
           "HookRequest"]
