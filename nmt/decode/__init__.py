"""The search: beam search and sampling over the core's model, one loop whose step varies.

Read in this order: :mod:`~nmt.decode.beams` (the state, its step and the exact stopping rule),
:mod:`~nmt.decode.search` (the loop and the one way in, :func:`~nmt.decode.search.translate_batch`),
:mod:`~nmt.decode.restrictions` (what may never be written), :mod:`~nmt.decode.sampling` and
:mod:`~nmt.decode.steering` (the hooks that draw instead of searching, and that steer), then the
steps: :mod:`~nmt.decode.scorers` (step by step, the dynamic cache) and :mod:`~nmt.decode.static`
(fixed shapes, CUDA graphs on a GPU).

Like :mod:`nmt.core`, it imports only torch, NumPy, :mod:`nmt.config` and the core
(``tests/test_layers.py`` checks every import against ``docs/architecture.md``'s layer table).
"""
