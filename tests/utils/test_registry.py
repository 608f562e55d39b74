"""The registry every named thing goes through: a name registered twice by different code fails naming both
places, the same definition again does not, an unknown name lists the known ones; and each of longboat's seven
registries behaves so."""

import builtins
import importlib.util
import re
import sys

import pytest
from torch import nn

from longboat.config.base import ConfigError, StrictModel
from longboat.errors import LongboatError
from longboat.utils.plugins import load_plugins
from longboat.utils.registry import Registry, RegistryError

HERE = r"tests/utils/test_registry\.py:\d+"


class First:
    pass


class Second:
    pass


def test_a_name_registered_twice_names_both_places():
    reg = Registry("widget")
    reg.register("w", First)
    with pytest.raises(RegistryError) as e:
        reg.register("w", Second)
    assert re.fullmatch(rf"widget 'w' registered twice: first by {__name__}\.First \({HERE}\), again by "
                        rf"{__name__}\.Second \({HERE}\); give one of them another name", str(e.value)), str(e.value)
    assert isinstance(e.value, LongboatError) and e.value.exit_code == 2
    assert reg.get("w") is First  # the first stays


def test_objects_without_a_definition_are_placed_by_the_registering_line():
    reg = Registry("setting")
    reg.register("a", {"x": 1})
    with pytest.raises(RegistryError, match=rf"first by {HERE}, again by {HERE};") as e:
        reg.register("a", {"x": 2})
    first, again = re.findall(r":(\d+)", str(e.value))
    assert int(again) == int(first) + 2


def test_the_same_definition_again_is_no_error(tmp_path):
    """The very object again, or the same file imported a second time under another module name (a plugin
    named once as a file and once as a module): the later one replaces the first, quietly."""
    reg = Registry("widget")
    assert reg.register("w", First) is First and reg.register("w", First) is First
    plugin = tmp_path / "widgets.py"
    plugin.write_text("import builtins\n\n@builtins.longboat_test_registry.decorator('gadget')\nclass Gadget:\n"
                      "    pass\n")
    builtins.longboat_test_registry = gadgets = Registry("gadget")
    try:
        load_plugins([str(plugin)])
        spec = importlib.util.spec_from_file_location("widgets_again", plugin)
        module = sys.modules["widgets_again"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        del builtins.longboat_test_registry
        sys.modules.pop("widgets_again", None)
    assert gadgets.get("gadget") is module.Gadget and len(gadgets) == 1


def test_an_unknown_name_lists_the_known_ones_and_a_close_match():
    reg = Registry("benchmark", "known benchmarks", ConfigError, hint="register one from a plugin")
    for name in ("pusht", "fetch", "metaworld"):
        reg.register(name, type(name, (), {}))
    with pytest.raises(ConfigError, match=r"^unknown benchmark 'fecth'; did you mean 'fetch'\? known benchmarks: "
                                          r"fetch, metaworld, pusht \(register one from a plugin\)$"):
        reg.get("fecth")
    with pytest.raises(ConfigError, match=r"^unknown benchmark 'zzz'; known benchmarks: fetch"):
        reg["zzz"]
    assert reg.get("zzz", None) is None
    assert list(reg) == ["pusht", "fetch", "metaworld"] and reg.names() == ["fetch", "metaworld", "pusht"]
    assert "fetch" in reg and "fecth" not in reg and len(reg) == 3


def test_a_copy_leaves_the_registry_untouched():
    reg = Registry("widget")
    reg.register("w", First)
    other = reg.copy()
    other.register("v", Second)
    del other["w"]
    assert list(reg) == ["w"] and list(other) == ["v"]
    with pytest.raises(RegistryError, match="a widget needs a non-empty name"):
        reg.register("", Second)


# ---- each of longboat's registries: a built-in name taken again ------------------------------------------------


def _task():
    from longboat.tasks import Task, register_task

    class OtherTask(Task):
        pass

    register_task("policy")(OtherTask)


def _model():
    from longboat.models import ModelSpec, register_model
    from longboat.models.policy.mlp.config import MLPPolicyConfig

    class OtherModule(nn.Module):
        pass

    register_model(ModelSpec(name="mlp", config=MLPPolicyConfig, module=OtherModule))


def _hf_adapter():
    from longboat.models.llm.hf.adapter import HFAdapter, hf_families, register_hf_adapter

    hf_families()  # the built-in adapters registered

    class OtherAdapter(HFAdapter):
        pass

    register_hf_adapter("llama")(OtherAdapter)


def _transform():
    from longboat.data.robot.transforms import Transform, register_transform

    class OtherTransform(Transform):
        Config = StrictModel

    register_transform("normalize")(OtherTransform)


def _simulator():
    from longboat.sim import SimEnv, register_simulator

    class OtherSim(SimEnv):
        pass

    register_simulator("fetch", lambda: ["reach"])(OtherSim)


def _runner():
    from longboat.eval.runners import Runner, register_runner

    class OtherRunner(Runner):
        pass

    register_runner("fetch")(OtherRunner)


def _chat_template():
    from longboat.data.chat.builtin import register_chat_template

    register_chat_template("chatml", "{{ messages }}")


@pytest.mark.parametrize("register, message", [
    (_task, r"task 'policy' registered twice: first by longboat\.tasks\.policy\.PolicyTask "
            r"\(src/longboat/tasks/policy\.py:\d+\), again by .*OtherTask"),
    (_model, r"model architecture 'mlp' registered twice: first by src/longboat/models/policy/mlp/\w+\.py:\d+, "
             rf"again by {HERE};"),
    (_hf_adapter, r"HF model_type 'llama' registered twice: first by longboat\.models\.llm\.adapters\.llama\.\w+ "
                  r"\(src/longboat/models/llm/adapters/llama\.py:\d+\), again by .*OtherAdapter"),
    (_transform, r"transform 'normalize' registered twice: first by longboat\.data\.robot\.transforms\.normalize\.\w+ "
                 r"\(src/longboat/data/robot/transforms/normalize\.py:\d+\), again by .*OtherTransform"),
    (_simulator, r"simulator 'fetch' registered twice: first by longboat\.sim\.fetch_env\.FetchEnv "
                 r"\(src/longboat/sim/fetch_env\.py:\d+\), again by .*OtherSim"),
    (_runner, r"benchmark 'fetch' registered twice: first by longboat\.eval\.runners\.sim\.FetchRunner "
              r"\(src/longboat/eval/runners/sim\.py:\d+\), again by .*OtherRunner"),
    (_chat_template, r"chat template 'chatml' registered twice: first by src/longboat/data/chat/builtin\.py:\d+, "
                     rf"again by {HERE};"),
], ids=["task", "model", "hf_adapter", "transform", "simulator", "runner", "chat_template"])
def test_each_registry_refuses_a_builtin_name_taken_again(register, message):
    with pytest.raises(RegistryError, match=message):
        register()
    with pytest.raises(RegistryError, match=rf"again by .*\({HERE}\)|again by {HERE}"):  # this file, and its line
        register()
