"""Registers the architecture ``marker_decoder`` (the built-in decoder under another name) and, when the variable
``LONGBOAT_TEST_PLUGIN_MARKER`` names a file, writes that file: a test sees whether the plugin was imported."""

import os
from pathlib import Path

from longboat.models import ModelSpec, get_model, register_model

_decoder = get_model("decoder")
register_model(ModelSpec("marker_decoder", _decoder.config, _decoder.module))

if os.environ.get("LONGBOAT_TEST_PLUGIN_MARKER"):
    Path(os.environ["LONGBOAT_TEST_PLUGIN_MARKER"]).write_text("imported\n")
