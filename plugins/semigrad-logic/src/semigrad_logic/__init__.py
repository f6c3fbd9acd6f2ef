"""semigrad semiring plugins about path existence and extremes.

Entry points (group `semigrad.semirings`), all in `semigrad_logic.semirings`:

* `boolean`    (or, and): does a path with only non-zero partials exist?
* `counting`   (+, ×) over 1[∂ ≠ 0]: how many such paths?
* `maxplus`    (max, +) over log|∂|: log of the best path product.
* `minplus`    (min, +) over log|∂|: log of the worst non-zero path product.
* `bottleneck` (max, min) over |∂|: the widest path (largest smallest |∂| on a path).
"""

__version__ = "0.1.0"
