"""The generated kernels a cuda plan carries besides the tuned GEMM winners: GEMM variants with a site's
epilogue fused in (epilogue_match.py), and one kernel per elementwise chain (chain_kernel.py). Both are
optional speed-ups: a kernel that cannot be generated, fails to compile or spills is logged and the
device runs the same work as separate array ops, so a build never fails for them.
"""

from __future__ import annotations

import hashlib

CUBIN_SECTION = "cubin/"


def _spills(resources: dict | None) -> bool:
    return any((resources or {}).get(k) for k in ("stack_frame", "spill_stores", "spill_loads"))


class EpilogueFuser:
    """plain winner + a site's epilogue -> the name of the variant that does both in one launch, or None
    (no epilogue, or the fused variant fails to compile or spills: then the site runs the epilogue as
    separate ops after the plain kernel). Each variant is compiled once per build."""

    def __init__(self, arch: str, cubins, log):
        self.arch, self.cubins, self.log, self._ok = arch, cubins, log, {}

    def __call__(self, plain: str, epilogue) -> str | None:
        from .compile import CompileError, cubin_for  # noqa: PLC0415
        from .variants import BY_NAME, Epilogue, with_epilogue  # noqa: PLC0415

        if epilogue is None:
            return None
        tile = BY_NAME[plain]  # a 16-bit site's tile keeps its fp32 output (variants.TO_F32)
        variant = with_epilogue(tile, Epilogue(bias=epilogue.bias is not None, act=epilogue.act,
                                               residual=epilogue.residual is not None, out_dtype=tile.epilogue.out_dtype))
        if variant.name not in self._ok:
            try:
                resources = cubin_for(variant, self.arch, self.cubins)[1].get("resources")
                spills = _spills(resources)
                self._ok[variant.name] = not spills
                if spills:
                    self.log(f"epilogue not fused: {variant.name} spills registers ({resources})")
            except CompileError as error:
                self._ok[variant.name] = False
                self.log(f"epilogue not fused: {variant.name} does not compile ({str(error).splitlines()[0]})")
        return variant.name if self._ok[variant.name] else None


def compile_chains(program, shapes_by_level: dict, arch: str, cubins, log, skip=frozenset()) -> tuple[dict, dict]:
    """One generated kernel per distinct float32 ElementwiseChain, and per standalone activation that is
    several launches op by op (codegen/chain_kernel.py, chain_ops): plan sections and meta["cuda"]["chains"].
    A chain that cannot be generated, fails to compile or spills runs op by op on the device (logged)."""
    from .chain_kernel import UnsupportedChain, chain_ops, render_chain  # noqa: PLC0415
    from .compile import CompileError, cubin_for_source  # noqa: PLC0415

    sections, chains = {}, {}
    for index, step in enumerate(program.steps):
        ops = chain_ops(step)
        if ops is None or index in skip:
            continue
        if any(shapes.get(step["outputs"][0], (None, None))[1] != "float32" for shapes in shapes_by_level.values()):
            continue
        try:
            source, entry = render_chain(ops, len(step["inputs"]))
            if entry not in chains:
                cubin, info = cubin_for_source(source, entry, arch, cubins)
                if _spills(info.get("resources")):
                    raise CompileError(f"{entry} spills registers ({info.get('resources')})")
                sections[CUBIN_SECTION + entry] = cubin
                chains[entry] = {"section": CUBIN_SECTION + entry, "num_inputs": len(step["inputs"]), "steps": [],
                                 "arch": arch, "sha256": hashlib.sha256(cubin).hexdigest(), **info}
            chains[entry]["steps"].append(index)
        except (UnsupportedChain, CompileError) as error:
            log(f"elementwise chain '{step.get('name', index)}' runs op by op: {str(error).splitlines()[0]}")
    return sections, chains


def compile_rows(program, arch: str, cubins, log) -> tuple[dict, dict]:
    """The row kernels the program's steps launch (codegen/row_kernels.py): plan sections and
    meta["cuda"]["rows"]. One that fails to compile or spills is left out (logged): its ops run as array ops."""
    from .compile import CompileError, cubin_for_source  # noqa: PLC0415
    from .row_kernels import row_entries, row_source  # noqa: PLC0415

    sections, rows = {}, {}
    for entry in row_entries(program.steps):
        try:
            cubin, info = cubin_for_source(row_source(entry), entry, arch, cubins)
            if _spills(info.get("resources")):
                raise CompileError(f"{entry} spills registers ({info.get('resources')})")
        except CompileError as error:
            log(f"row kernel {entry} left out, its ops run as array ops: {str(error).splitlines()[0]}")
            continue
        sections[CUBIN_SECTION + entry] = cubin
        rows[entry] = {"section": CUBIN_SECTION + entry, "arch": arch, "sha256": hashlib.sha256(cubin).hexdigest(), **info}
    return sections, rows
