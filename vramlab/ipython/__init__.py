"""The IPython layer: the ``%vram`` magics (:mod:`.magics`), the cell callbacks
(:mod:`.events`) and their symmetric registration (:mod:`.extension`).

With :mod:`vramlab.display.widget`, these are the only modules that import IPython.
"""
