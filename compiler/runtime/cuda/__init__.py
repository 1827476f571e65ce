"""GPU runtime pieces. Importing this package never imports CuPy: launcher.py does, lazily, when a
kernel is first loaded, so the CPU runtime and CI never need a GPU stack."""
