"""The report (sections, page) on top and the plotting leaf (``*_plots.py``, ``views.py``)."""
