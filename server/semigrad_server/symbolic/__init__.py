"""IR ↔ SymPy: the safe expression language, custom ops, symbolic gradients, finite
differences and cross-check reports.

Modules, one job each: `parse` (expression text → SymPy, whitelist over `ast`), `numeric`
(SymPy → NumPy functions and Python source), `custom` (op definitions → ops), `expand`
(graph → SymPy scalar expressions), `gradient` (symbolic gradients as formulas),
`finite_diff` (central differences, Richardson, complex step), `paths` (brute-force path
enumeration under a semiring), `localise` (each node's rule against finite differences),
`crosscheck` (the comparison and its report), `report` (the report as text).
"""
