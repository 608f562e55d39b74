"""Parameter names as the plain model has them, whatever wraps it (a module of its own: the optimizer and EMA read
names without loading FSDP and DTensor)."""


def plain_name(name: str) -> str:
    """A parameter's name in the plain model: without DDP's ``module.``, checkpoint and compile wrappers."""
    name = name.removeprefix("module.")
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
