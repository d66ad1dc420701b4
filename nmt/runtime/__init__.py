"""How the core runs on a device, applied from outside it: ``device.py`` (device and dtype,
int8 and packed linear layers, attention kernels), ``compiled.py`` (``torch.compile`` of the
training step and the loss), ``dropout.py`` (the CPU's dropout masks), ``memory.py`` (glibc's
allocator kept from returning freed memory)."""
