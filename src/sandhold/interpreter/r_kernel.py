"""R contexts: IRkernel (Debian's r-cran-irkernel) driven as the Python kernel is
(python_kernel.py); per-call env vars set with Sys.setenv and put back after the cell."""

from __future__ import annotations

import json
import shutil

from jupyter_client.kernelspec import KernelSpec

from sandhold.interpreter.python_kernel import PythonContext

R = "/usr/bin/R"


def r_string(value: str) -> str:
    """An R string literal: JSON's double-quoted form is one (R knows its escapes, \\u too)."""
    return json.dumps(value)


def available() -> bool:
    return shutil.which(R) is not None


class RContext(PythonContext):
    language = "r"
    displays_are_main = True  # IRkernel shows a cell's value as display_data

    async def _start(self) -> None:
        if not available():
            raise RuntimeError(f"R is not installed in this sandbox ({R})")
        await super()._start()

    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(name="sandhold-r", argv=[R, "--slave", "-e", "IRkernel::main()",
                                                   "--args", "{connection_file}"],
                          display_name="R (sandhold)", language="R",
                          interrupt_mode="signal")  # fmt: skip

    def kernel_env(self) -> dict[str, str]:
        return dict(self.env)

    def set_env_code(self, env: dict[str, str]) -> str:
        pairs = ", ".join(f"{r_string(k)} = {r_string(v)}" for k, v in env.items())
        return f"do.call(Sys.setenv, list({pairs}))"

    def push_env_code(self, env: dict[str, str]) -> str:
        names = ", ".join(r_string(k) for k in env)
        return (
            f".sandhold_saved <- Sys.getenv(c({names}), unset = NA, names = TRUE); "
            + self.set_env_code(env)
        )

    def pop_env_code(self) -> str:
        return (
            "for (.k in names(.sandhold_saved)) if (is.na(.sandhold_saved[[.k]])) "
            "Sys.unsetenv(.k) else do.call(Sys.setenv, setNames(list(.sandhold_saved[[.k]]), "
            ".k)); rm(.sandhold_saved)"
        )
