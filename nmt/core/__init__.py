"""The core: the paper's model and the algorithms that train it, and nothing else.

Read in this order: :mod:`~nmt.core.pieces` (the special ids), :mod:`~nmt.core.layers` and
:mod:`~nmt.core.model` (Vaswani et al. 2017, §3), :mod:`~nmt.core.cache` (one decoding step's
state), :mod:`~nmt.core.batching`, :mod:`~nmt.core.loss`, :mod:`~nmt.core.schedule` and
:mod:`~nmt.core.update` (§5: batches, label smoothing, the learning rate, one optimizer update).
The search over the model, beam search and sampling, is :mod:`nmt.decode`, the layer above.

The core imports only torch, NumPy and :mod:`nmt.config`: no files, run directories, serving,
interop or command line (``tests/test_layers.py`` checks every import against
``docs/architecture.md``'s layer table). How it runs on a device (dtype, packing, int8, the
CPU's dropout masks, CUDA graphs, attention kernels) is applied from :mod:`nmt.runtime.device`.
"""
