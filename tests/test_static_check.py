"""The static check refuses patches that could reach the host, read clocks or write outside their region, and
passes ordinary device code: every rule has a case it rejects and a near miss it lets through."""
import pytest

from kernel_factory.evo.regions import regions as regions_of
from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import render, static_check
from kernel_factory.evo.types import Status

REJECTED = [  # (region, body, a fragment of the reason)
    ("reduce", "#include <cstdio>\n", "#include <cstdio> is not allowed"),
    ("reduce", '#include "/etc/passwd"\n', "is not allowed"),
    ("reduce", "__host__ float f(float x) { return x; }\n", "__host__"),
    ("reduce", "int main() { return 0; }\n", "main ("),
    ("reduce", 'extern "C" __device__ float g(float);\n', "extern"),
    ("reduce", "__global__ void k() {}\n", "__global__"),
    ("second_pass", 'printf("%d\\n", 1);\n', "printf"),
    ("second_pass", 'system("rm -rf /");\n', "system"),
    ("second_pass", "FILE* f = fopen(\"x\", \"w\");\n", "fopen"),
    ("reduce", "void h() { std::cout << 1; }\n", "cout"),
    ("reduce", "void h() { std::thread t; }\n", "thread"),
    ("second_pass", "float* p = (float*)malloc(4);\n", "malloc"),
    ("second_pass", "cudaMalloc(0, 4);\n", "CUDA runtime API"),
    ("second_pass", "k<<<1, 1>>>();\n", "<<<"),
    ("second_pass", "long long t = clock64();\n", "clock64"),
    ("second_pass", "long long t = clock();\n", "clock"),
    ("second_pass", 'unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n', "globaltimer"),
    ("second_pass", 'unsigned t; asm volatile("mov.u32 %0, %%glob" "altimer_lo;" : "=r"(t));\n', "globaltimer"),
    ("second_pass", 'unsigned s; asm("mov.u32 %0, %%smid;" : "=r"(s));\n', "smid"),
    ("second_pass", 'unsigned c; asm("mov.u32 %0, %%clock;" : "=r"(c));\n', "clock"),
    ("second_pass", 'unsigned c; asm("mov.u32 %0, %%\\x63lock;" : "=r"(c));\n', "clock"),
    ("second_pass", 'unsigned c; asm("mov.u32 %0, %%\\143lock;" : "=r"(c));\n', "clock"),
    ("second_pass", 'unsigned c; asm("mov.u32 %0, %%cl\\\nock;" : "=r"(c));\n', "clock"),
    ("second_pass", 'asm(".entry evil() { ret; }");\n', "PTX module directive"),
    ("second_pass", 'asm("} ret; {");\n', "closes a PTX scope"),
    ("reduce", "// KF-EDIT-END reduce\n", "region marker"),
    ("second_pass", "}\nvoid evil() {\n", "closes a bracket"),
    ("second_pass", "if (rstd > 0.f) {\n", "unclosed"),
    ("second_pass", "#if 1\nif (rstd) {\n#else\nif (!rstd) {\n#endif\n}\n", "unbalanced in a branch"),
    ("second_pass", "#endif\n", "without its #if"),
    ("reduce", "#define THREADS 1024\n", "#define THREADS would change code outside"),
    ("reduce", "#define rstd 0.f\n", "#define rstd"),
    ("reduce", "#undef LOAD\n", "#undef LOAD"),
    ("second_pass", '#pragma push_macro("THREADS")\n', "#pragma push_macro"),
    ("second_pass", '_Pragma("unroll")\n', "_Pragma"),
    ("second_pass", '#line 1 "other.cu"\n', "directive #line"),
    ("second_pass", '#error "stop"\n', "directive #error"),
    ("reduce", "#\\\ndefine THREADS 64\n", "#define THREADS"),
    ("second_pass", "int a = 1; \\\n#define X 2\n", "stray #"),
    ("second_pass", 'const char* s = R"(x)";\n', "raw string"),
    ("reduce", "#define S(x) #x\n", "stringizing or token pasting"),
    ("reduce", "#define P(a, b) a##b\n", "stringizing or token pasting"),
    ("second_pass", "if (1) <% %>\n", "digraph"),
    ("second_pass", "??=define X 1\n", "trigraph"),
    ("reduce", "__device__ int counter;\n", "__device__ variable"),
    ("second_pass", "static int n = 0; ++n;\n", "static variable"),
    ("second_pass", "float x = 1.f; /* printf is in a comment */ printf(\"x\");\n", "printf"),
    ("second_pass", "int x\u202e = 1;\n", "U+202E"),
    ("second_pass", "// " + "x" * (static_check.MAX_REGION_BYTES + 1) + "\n", "byte limit"),
]

ACCEPTED = [  # near misses of the rules above
    ("reduce", "#include <cuda_bf16.h>\n"),
    ("reduce", "__device__ float f(float x) { return x; }\n"),
    ("second_pass", "int main_count = 1; (void)main_count;\n"),
    ("second_pass", '// extern "C", printf, fopen and %clock are fine in a comment\n'),
    ("second_pass", "/* std::cout << clock(); */\n"),
    ("second_pass", 'unsigned l; asm("mov.u32 %0, %%laneid;" : "=r"(l));\n'),
    ("second_pass", "const int warpid = threadIdx.x / 32; (void)warpid;\n"),
    ("second_pass", 'asm volatile("{\\n .reg .pred p;\\n }" ::: "memory");\n'),
    ("second_pass", "if (rstd > 0.f) { yr[0] = xr[0]; }\n"),
    ("second_pass", "#if REDUCE == REDUCE_SHFL\nif (lane) { }\n#else\nif (!lane) { }\n#endif\n"),
    ("reduce", "#define MY_HELPER_SCALE 3\n#undef MY_HELPER_SCALE\n"),
    ("second_pass", "#pragma unroll 4\nfor (int i = 0; i < 4; ++i) { }\n"),
    ("second_pass", "// a comment \\\n#define THREADS 2\n"),
    ("second_pass", "static constexpr int K = 4; __shared__ float s[32]; (void)s;\n"),
    ("second_pass", "const int big = 1'000'000; const char c = '{'; (void)big; (void)c;\n"),
    ("second_pass", "// " + "x" * 1000 + "\n"),
]


@pytest.fixture(scope="module")
def template(rmsnorm) -> str:
    return rmsnorm.template()


@pytest.mark.parametrize("region,body,fragment", REJECTED)
def test_rejects(template, region, body, fragment):
    reason = static_check.check(template, {region: body})
    assert reason is not None and fragment in reason, reason
    assert reason.startswith(f"region {region!r}, ") and "\n" not in reason


@pytest.mark.parametrize("region,body", ACCEPTED)
def test_accepts(template, region, body):
    assert static_check.check(template, {region: body}) is None


@pytest.mark.parametrize("name", ["rmsnorm_fwd", "softmax_fwd"])
def test_every_templates_own_regions_pass_unchanged(name):
    problem = registry.load("problem", name)
    regions = regions_of(problem.template())
    assert regions
    assert static_check.check(problem.template(), regions) is None
    for region, body in regions.items():
        assert static_check.screen(problem.template(), {region: body}) is None


def test_unknown_region_is_invalid_patch_not_rejected(template):
    status, message = static_check.screen(template, {"nowhere": "int x;\n"})
    assert status is Status.INVALID_PATCH and "nowhere" in message
    status, message = static_check.screen(template, {"reduce": "#include <cstdio>\n"})
    assert status is Status.REJECTED and message.startswith("static check: region 'reduce'")
    assert static_check.screen(template, {}) is None


def test_line_numbers_point_at_the_offending_line(template):
    body = "float a = 1.f;\n// fine\nfloat b = 2.f;\nlong long t = clock64();\n"
    assert "line 4:" in static_check.check(template, {"second_pass": body})
