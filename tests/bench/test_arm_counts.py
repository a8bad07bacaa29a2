"""``dualpath bench arm``'s instruction counting: the QEMU plugin (arm_tools/insn_count.c)
built by the host's compiler and run on small static aarch64 programs, the attribution of
its per-block counts to functions, and the per-token differences. The llama.cpp builds and
DualPath's aarch64 userland take minutes and are left to the bench itself."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from dualpath.bench import arm

LOOP_C = r"""
#include <stdio.h>
#include <stdlib.h>
/* noinline: the loop is one function of its own, for the attribution */
__attribute__((noinline)) long spin(long n) {
    volatile long s = 0;
    for (long i = 0; i < n; i++) s += i;
    return s;
}
int main(int argc, char **argv) {
    spin(argc > 1 ? atol(argv[1]) : 0);
    if (argc > 2) { /* copy /proc/self/maps (guest addresses under QEMU) */
        FILE *in = fopen("/proc/self/maps", "r"), *out = fopen(argv[2], "w");
        int c;
        while ((c = fgetc(in)) != EOF) fputc(c, out);
        fclose(in);
        fclose(out);
    }
    return 0;
}
"""

I8MM_C = r"""
#include <arm_neon.h>
int main(void) {
    volatile int8_t a = 1; /* volatile: the product is made at run time, with SMMLA */
    int32x4_t r = vmmlaq_s32(vdupq_n_s32(0), vdupq_n_s8(a), vdupq_n_s8(a));
    return vgetq_lane_s32(r, 0) == 8 ? 0 : 1;
}
"""


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found (apt-get install qemu-user gcc-aarch64-linux-gnu gcc)")


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    """(plugin .so, a static aarch64 loop program, its folder)."""
    _need("qemu-aarch64", "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-nm")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no host C compiler (cc or gcc) to build the QEMU plugin")
    folder = tmp_path_factory.mktemp("arm")
    plugin = arm.build_plugin(str(folder / "cache"))
    (folder / "loop.c").write_text(LOOP_C)
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-static", "-o", str(folder / "loop"), str(folder / "loop.c")],
                   check=True)
    return plugin, str(folder / "loop"), str(folder)


def _count(tools, n: int, breakdown: bool = False):
    plugin, loop, folder = tools
    maps = f"{folder}/maps-{n}.txt"
    proc, insns, threads, tbs = arm.run_qemu("max", [loop, str(n), maps], plugin, folder, breakdown)
    assert proc.returncode == 0 and threads == 1
    return insns, tbs, maps


def test_the_same_program_counts_the_same_and_each_iteration_adds_the_same(tools):
    a, _, _ = _count(tools, 1000)
    assert _count(tools, 1000)[0] == a
    b, _, _ = _count(tools, 2000)
    c, _, _ = _count(tools, 3000)
    assert b > a
    assert c - b == b - a  # exact: each 1000 iterations add the same count
    assert (b - a) % 1000 == 0 and 2 <= (b - a) // 1000 <= 12  # a few instructions an iteration


def test_the_breakdown_sums_to_the_total_and_the_loop_is_in_its_function(tools):
    total, tbs, maps = _count(tools, 5000, breakdown=True)
    assert sum(tbs.values()) == total
    functions = arm.Symbols().attribute(tbs, maps, None)
    assert sum(functions.values()) == total
    short, short_tbs, short_maps = _count(tools, 1000, breakdown=True)
    short_functions = arm.Symbols().attribute(short_tbs, short_maps, None)
    grown = {k: functions.get(k, 0) - short_functions.get(k, 0) for k in functions}
    assert grown["loop:spin"] == total - short  # every added instruction is the loop's


def test_a_program_using_an_extension_the_cpu_model_lacks_is_a_sigill(tools):
    plugin, _, folder = tools
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-static", "-march=armv8.2-a+i8mm", "-x", "c", "-",
                    "-o", f"{folder}/i8mm"], input=I8MM_C, text=True, check=True)
    arm.run_qemu("max", [f"{folder}/i8mm"], plugin, folder, False)
    with pytest.raises(arm.IllegalInstruction, match="SIGILL under -cpu cortex-a76"):
        arm.run_qemu("cortex-a76", [f"{folder}/i8mm"], plugin, folder, False)


def test_per_token_takes_the_differences_of_long_and_short_runs():
    def count(cpu, ids, num_generate, breakdown):  # 1000 to load, 50 a prompt token, 300 a generated one
        insns = 1000 + 50 * len(ids) + 300 * (num_generate - 1)
        return arm.Count(insns, 1, {"ids": list(range(num_generate))},
                         {"lib:matmul": insns - 1000, "lib:load": 1000})

    row = arm.per_token(count, "max", list(range(96)), arm.FULL_LENGTHS, True)
    assert row["decode_insns_per_token"] == 300 and row["prompt_insns_per_token"] == 50
    assert row["decode_functions"] == {"lib:matmul": 300, "lib:load": 0}
    assert row["runs"] == {"decode_short": 1000 + 50 * 32 + 300 * 7, "decode_long": 1000 + 50 * 32 + 300 * 23,
                           "prompt_short": 1000 + 50 * 32, "prompt_long": 1000 + 50 * 96}


def test_demangled_names_lose_their_parameters_and_keep_their_template_arguments():
    assert arm._short_name("ggml_compute_forward_mul_mat(ggml_compute_params const*, ggml_tensor*)") == \
        "ggml_compute_forward_mul_mat"
    assert arm._short_name("void gemv<block_q4_K, 8l>(int, float*)") == "void gemv<block_q4_K, 8l>"
    assert arm._short_name("dp_lrows_neon") == "dp_lrows_neon"


def test_a_missing_tool_names_its_package(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(arm.ArmBenchError, match=r"qemu-aarch64 not found: apt-get install qemu-user"):
        arm.need_tool("qemu-aarch64", "qemu-user")
