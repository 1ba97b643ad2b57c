"""The Gradio UI: the only package that imports gradio (``build_demo`` lives in ``steer_ui.ui.app``).

This ``__init__`` imports nothing heavy, so ``steer_ui.ui.i18n`` stays usable without gradio; it
turns gradio's usage analytics off before any submodule imports gradio.
"""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
