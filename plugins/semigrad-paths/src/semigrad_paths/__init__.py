"""semigrad semiring plugins about path weights.

Entry points (group `semigrad.semirings`), one module each so that a broken one cannot
stop the others from loading:

* `max_product` (max, ×) over |∂|: the weight of the best single path (Viterbi).
* `log`         log Σ_paths Π|∂| (log-sum-exp, ×): the real gradient of |∂|, in log space.
* `entropy`     the Shannon entropy of the path distribution p(path) ∝ Π|∂|.
* `kbest`       the k largest path products of |∂| (parameter k).
"""

__version__ = "0.1.0"
