"""webrl_core: the WebRL library (no Prefect imports). See each module's docstring for its formula."""

__version__ = "0.1.0"
