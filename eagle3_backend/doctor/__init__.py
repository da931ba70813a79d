"""``eagle3 doctor``: find the hidden states a draft was really trained on.

A draft served on other hidden states than it was trained on loads without an
error and collapses (74.7% training accuracy, 34.1% served). The layout a
checkpoint records is only as good as the tool that wrote it; the doctor asks
the draft itself. It runs the target once over real prompts and its own greedy
answers, capturing every residual-stream state, then scores the draft's first
speculative step (top-1 against the target's greedy next token, answer tokens
only) with the fc input built from each candidate layout, and keeps scoring more
prompts until it can say whether another layout fits better than the recorded one.

Modules (none imports this package's ``__init__``, none imports a sibling that
imports it back):

* :mod:`.candidates` the layouts tried: plausible miswirings, the coordinate search;
* :mod:`.scoring`    the target's states captured once, the draft scored on them;
* :mod:`.verdict`    OK / MISMATCH / WEAK / INCONCLUSIVE and the sequential rule;
* :mod:`.diagnose`   the looks: score, decide, score more prompts while undecided;
* :mod:`.serve`      ``--url``: a live server's acceptance vs the offline verifier's;
* :mod:`.report`, :mod:`.plot`  the reports as text and as a chart;
* :mod:`.cli`        the ``eagle3 doctor`` command.
"""
