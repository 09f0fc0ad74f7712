"""Cython declarations of the plain-C layer (``csrc/``): one ``.pxd`` per C
header, for the extension modules and for Cython code that cimports them."""
