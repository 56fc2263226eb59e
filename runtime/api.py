"""``runtime.load(path)``: a compiled artifact as a Python callable, with the runtime alone.

    import runtime
    step = runtime.load("build/mlp")
    loss, w1, b1, w2, b2 = step(x, y, w1, b1, w2, b2)      # positional, in parameter order
    loss, *params = step(x=x, y=y, w1=w1, b1=b1, w2=w2, b2=b2)   # or by name (or both)

Inputs are checked against the manifest (names, dtypes, shapes); outputs come
back in the function's return structure (the manifest's template). A function
with pytree parameters takes them as it did (``step(params, opt_state, batch)``):
each argument is read through the structure the manifest records
(``parameters``), dicts by key and lists by position. Static
(Python scalar) parameters were fixed at compile time: passing one is allowed
when it has the recorded value. ``step.feeds`` maps input names to the output
slots that update them (the manifest's ``feeds``), which :meth:`Program.loop`
and ``bendc run --steps N --feed-outputs`` use.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from runtime.artifact import (InputsInvalid, check_inputs, flatten_inputs, has_structure, load_program, on_host,
                              unflatten_outputs)
from runtime.cpu import KernelError
from runtime.machine import compile_counts


class Program:
    """A verified, loaded artifact: call it like the function it was compiled from."""

    def __init__(self, folder: str, cuda_runtime: str | None = None, outputs: str = "copy",
                 trust: bool = False) -> None:
        self.folder = folder
        self.manifest, self.plan, self._program = load_program(folder, cuda_runtime=cuda_runtime, outputs=outputs,
                                                               trust=trust)
        self.names = [spec["name"] for spec in self.manifest["inputs"]]
        self.static = dict(self.manifest.get("static", {}))
        self.feeds: dict[str, int] = {name: int(index) for name, index in self.manifest.get("feeds", {}).items()}
        # Pytree parameters: called by parameter (each a structure), not by flat input.
        self.parameters: dict | None = self.manifest["parameters"] if has_structure(self.manifest) else None

    @property
    def function(self) -> str:
        return self.manifest["function"]

    def __repr__(self) -> str:
        names = list(self.parameters) if self.parameters is not None else self.names
        return f"<bendc program {self.function}({', '.join(names)}) from {self.folder}>"

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[np.ndarray]:
        """The inputs in parameter order from positional and named arguments, checked."""
        if self.parameters is not None:
            return self._bind_structured(args, kwargs)
        if len(args) > len(self.names):
            raise InputsInvalid(f"{self.function} takes {len(self.names)} inputs ({', '.join(self.names)}), "
                                f"got {len(args)} positional")
        bound = dict(zip(self.names, args))
        for name, value in kwargs.items():
            if name in self.static:
                if value != self.static[name]:
                    raise InputsInvalid(f"{name} was fixed to {self.static[name]!r} when {self.function} was "
                                        f"compiled (got {value!r}): rebuild with --static {name}={value!r}")
                continue
            if name not in self.names:
                raise InputsInvalid(f"unknown input {name!r}; {self.function} takes {', '.join(self.names)}")
            if name in bound:
                raise InputsInvalid(f"input {name!r} given twice (positionally and by name)")
            bound[name] = value
        missing = [name for name in self.names if name not in bound]
        if missing:
            raise InputsInvalid(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                                f"{self.function} takes {', '.join(self.names)}")
        return check_inputs(self.manifest, [bound[name] for name in self.names])

    def _bind_structured(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[np.ndarray]:
        """Arguments by parameter (positional in the function's order), flattened through the
        recorded structures to the inputs in order."""
        parameters = list(self.parameters)
        if len(args) > len(parameters):
            raise InputsInvalid(f"{self.function} takes {len(parameters)} parameters ({', '.join(parameters)}), "
                                f"got {len(args)} positional")
        bound = dict(zip(parameters, args))
        for name, value in kwargs.items():
            if name not in self.parameters:
                raise InputsInvalid(f"unknown parameter {name!r}; {self.function} takes {', '.join(parameters)}")
            if name in bound:
                raise InputsInvalid(f"parameter {name!r} given twice (positionally and by name)")
            bound[name] = value
        flat = flatten_inputs(self.parameters, bound)
        return check_inputs(self.manifest, [flat[name] for name in self.names])

    def run_flat(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs as a flat list (out0, out1, ...) of checked inputs in parameter order."""
        return [on_host(o) for o in self._run(inputs)]

    def _run(self, inputs: list[Any]) -> list[Any]:
        try:
            return self._program.run(inputs)
        except KernelError as error:
            step = next((s for s in self.plan["steps"] if s["name"] == error.step), None)
            if step is None or not step.get("loc"):
                raise
            raise KernelError(error.step, f"{step['loc']}: {step['op']}: {error.detail}") from None

    def run_device(self, *args: Any, **kwargs: Any) -> list[Any]:
        """A cuda artifact's flat outputs left on the device (``copy_to_host()``,
        ``__cuda_array_interface__``); inputs may be torch CUDA tensors, copied device to device."""
        if self.manifest["target"] != "cuda":
            raise InputsInvalid(f"{self.folder} was built for {self.manifest['target']}: run_device is for cuda")
        return self._run(self.bind(args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return unflatten_outputs(self.manifest["template"], self.run_flat(self.bind(args, kwargs)))

    def loop(self, steps: int, *args: Any, feeds: Mapping[str, int] | None = None, **kwargs: Any) -> list[np.ndarray]:
        """Run ``steps`` times, each step's outputs ``feeds`` (input name -> output slot; default the
        manifest's) becoming the next step's inputs; the last step's flat outputs (host arrays).
        A cuda program feeds its device outputs back as they are: a donated parameter's update,
        resident in the parameter's own buffer, is then not copied at all (runtime/cuda_graph.py)."""
        feeds = self.feeds if feeds is None else dict(feeds)
        if not feeds:
            raise InputsInvalid(f"{self.folder} records no outputs to feed back (compile with --feed OUT=INPUT)")
        inputs = self.bind(args, kwargs)
        slot = {name: index for index, name in enumerate(self.names)}
        outputs: list[Any] = []
        for _ in range(steps):
            outputs = self._run(inputs)
            for name, index in feeds.items():
                inputs[slot[name]] = outputs[index]
        return [on_host(o) for o in outputs]

    def compile_counts(self) -> dict[str, int]:
        """Functions numba compiled and loaded (from the artifact's machine code) in this process."""
        return compile_counts(getattr(self._program, "modules", []))  # cuda programs: none counted


def load(path: str, *, cuda_runtime: str | None = None, outputs: str = "copy", trust: bool = False) -> Program:
    """The artifact at ``path`` (written by ``bendc compile``), verified and ready to call.

    An artifact is code, like a wheel: it must be signed with this user's key (``$BENDC_KEY_FILE``,
    else ~/.config/bendc/key; runtime/trust.py), or ArtifactUntrusted is raised before anything in
    it is imported. ``trust=True`` accepts it deliberately, checking its hashes only.

    A cuda artifact runs its cubins as one CUDA graph per step on a GPU of its architecture
    (``cuda_runtime``: "auto", "graph", "eager" launches, or "numba" JIT; default
    ``$BENDC_CUDA_RUNTIME`` or "auto"); ``outputs="copy"`` (default) returns fresh outputs each
    call, ``"static"`` the graph's own buffers, overwritten by the next call."""
    return Program(path, cuda_runtime, outputs, trust)
