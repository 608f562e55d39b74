import pytest

from longboat.utils.plugins import PluginError, load_plugins


def test_plugin_errors_name_the_plugin(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(PluginError, match=r"plugin 'broken.py': import failed: ModuleNotFoundError"):
        load_plugins(["broken.py"], base_dir=tmp_path)
    with pytest.raises(PluginError, match=r"plugin 'no_such_plugin_module': no module of that name"):
        load_plugins(["no_such_plugin_module"])
    with pytest.raises(PluginError, match=r"plugin 'missing.py': no such file"):
        load_plugins(["missing.py"], base_dir=tmp_path)


def test_file_plugins_load_once_and_resolve_to_absolute_paths(tmp_path):
    plugin = tmp_path / "counter.py"
    plugin.write_text("import builtins\nbuiltins.longboat_test_count = getattr(builtins, 'longboat_test_count', 0) + 1\n")
    import builtins

    first = load_plugins(["counter.py"], base_dir=tmp_path)
    again = load_plugins([str(plugin)])
    assert first == again == [str(plugin.resolve())] and builtins.longboat_test_count == 1
