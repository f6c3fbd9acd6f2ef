"""IR ↔ SymPy: the safe expression language, custom ops, symbolic gradients, finite
differences and cross-check reports.

Modules, one job each:
  parse        expression text → SymPy (a whitelist over `ast`; never eval/sympify)
  numeric      SymPy → NumPy code (kernels, stand-alone source)
  custom       a graph's op definitions → ops, and the graph's op registry
  expand       graph → SymPy scalar expressions, one symbol per input element
  gradient     symbolic Jacobians (sympy.diff), evaluated with CSE; bounded
  formulas     the SymbolicGradient RPC: text, LaTeX, Python source
  finite_diff  central differences, Richardson, complex step
  compare      elementwise |a - b| <= atol + rtol·|b|
  localise     each node's rule against finite differences of that node alone
  paths        brute-force path enumeration under a semiring
  crosscheck   the CrossCheck RPC: methods, comparisons, localisation
  report       a cross-check report as text
  commands     `semigrad check FILE` and `semigrad diff EXPR ...`
"""
