# fsdpd: one plain Makefile (see docs/ARCHITECTURE.md for what lives where).
#
#   make          build the programs in bin/ (installs missing build packages only)
#   make test     also install what the tests need, build and run every test
#                 (make test-san: the same under ASan and UBSan)
#   make bench    also install what the benchmarks need, build and run them (`bench:` lines)
#   make demo     also install the demo corpus, tokenize it, train a small GPT on it
#
# Objects go to build/, programs to bin/. CC, OPT and ARCH may be overridden.
# -fno-math-errno: nothing reads errno after math calls, and it lets gcc
# vectorise sqrtf (AdamW: 3x faster).
# ARCH is baseline x86-64, so the binaries run on any x86-64 node; the CPU
# kernels, whose speed depends on wide vectors, are built once per level
# besides (KERN_ISAS) and chosen at run time. -ffp-contract=off: no fused
# multiply-adds, so the levels give the same bits (gcc's default in ISO C
# mode; clang's is on).

CC      = gcc
OPT    ?= -O3
ARCH   ?= -march=x86-64 -mtune=generic
CFLAGS  = -std=c11 -D_GNU_SOURCE $(OPT) $(ARCH) -g -fopenmp -fno-math-errno -ffp-contract=off \
          -Wall -Wextra -Werror -MMD -MP -I. $(EXTRA_CFLAGS)
LDFLAGS = -fopenmp $(EXTRA_LDFLAGS)
LDLIBS  = -ldnnl $(JOB_LDLIBS) -lcrypto -lm -lpthread
B       = build
# CUDA 13 lives in /usr/local/cuda on these machines (no GPU needed to compile).
NVCC   ?= /usr/local/cuda/bin/nvcc
NVFLAGS = -std=c++17 -I. -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
          -gencode arch=compute_90,code=compute_90
CUDA_LIB ?= $(dir $(NVCC))../lib64
CUDA_INC ?= $(dir $(NVCC))../include
HAVE_CUDA = $(wildcard $(NVCC))
# The CUDA plugin (daemon/train/device_cuda.h): the CUDA kernels (kernels/cuda,
# nvcc, -fmad=false: kern_math.h's formulas give the CPU's bits) and the NCCL
# collectives in one shared object that fsdp-train loads with dlopen for
# device = cuda; no program links it or any CUDA library. Built whenever nvcc
# is found (CI compiles and links it; only a GPU runs it).
CUDA_PLUGIN     = lib/fsdpd/libfsdp-cuda.so
CUDA_KERN_OBJS  = $(patsubst %.cu,$(B)/%.o,$(wildcard kernels/cuda/*.cu))
CUDA_PIC_OBJS   = $(B)/daemon/comm/nccl.pic.o $(B)/daemon/train/device_cuda.pic.o
CUDA_LDLIBS     = -L$(CUDA_LIB) -Wl,-rpath,/usr/local/cuda/lib64 -lcublasLt -lnccl -lcudart_static \
                  -ldl -lrt -lpthread -lstdc++ -lm
# The GPU tests (make test-cuda; here they build, a GPU runs them):
# kern_math.h's functions against the CPU kernels, built as nvcc compiles by
# default (fused multiply-adds) and with -fmad=false; every CUDA op against
# the CPU backend and float64; the NCCL backend's conformance at one rank.
CUDA_CHECKS = $(if $(HAVE_CUDA),$(B)/tests/cuda/kern_math_gpu $(B)/tests/cuda/kern_math_gpu_nofmad \
                $(B)/tests/cuda/test_cuda_kernels $(B)/tests/cuda/test_nccl $(B)/tests/cuda/test_cuda_train)

# Debian packages, by what needs them; mk/deps.sh installs those missing.
# Compiling and linking the programs:
BUILD_PKGS = build-essential pkg-config libdnnl-dev libinih-dev libuv1-dev libxxhash-dev \
             $(CONTROL_PKGS)
# The tests: Criterion; clang, its sanitizer and fuzzer runtimes and its OpenMP
# for the fuzz build; PyTorch and numpy for the reference runs; the demo
# corpus (test_train learns it); pgrep (test_launch looks for survivors);
# gRPC for Python, the independent client test_fsdpctl runs.
TEST_PKGS  = libcriterion-dev clang libclang-rt-14-dev libomp-14-dev python3 python3-numpy python3-torch \
             fortunes procps openssl python3-grpcio python3-grpc-tools python3-protobuf \
             systemd util-linux prometheus curl nodejs slurm-wlm munge
# The benchmarks: PyTorch for the peer runs, OpenBLAS and BLIS for the GEMM ceilings.
BENCH_PKGS = python3 python3-numpy python3-torch libopenblas-dev libblis-dev
# The demo's corpus.
DEMO_PKGS  = fortunes
# The control plane (coordinator, fsdpd, fsdpctl): gRPC's C core, protobuf-c
# and its compiler for the wire, SQLite for the coordinator's state, jansson
# for fsdpctl's --output json, libmicrohttpd for /metrics, uthash (header
# only) for the coordinator's jobs by id, libunistring for UTF-8 checks (the
# coordinator's, fsdpctl's, the text a rank reports),
# OpenSSL's libcrypto for the SHA-256 digests servers keep of tokens, libjwt
# for the Kubernetes service account tokens nodes may show instead.
CONTROL_PKGS = libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libsqlite3-dev libjansson-dev \
               libmicrohttpd-dev uthash-dev libunistring-dev libssl-dev libjwt-dev

COMMON_SRCS = daemon/common/err.c daemon/common/log.c daemon/common/param.c daemon/common/mem.c \
              daemon/common/frame.c daemon/common/crash.c daemon/common/netaddr.c \
              daemon/common/file.c daemon/common/hostmem.c
# kernels/cpu: backend.c once (it picks the level), the rest once per level,
# in $(B)/kernels/cpu/<level>/ (kernels/cpu/cpu.h names their symbols apart).
KERN_ISAS     = generic avx2 avx512
KERN_ISA_SRCS = kernels/cpu/table.c kernels/cpu/encoder.c kernels/cpu/layernorm.c \
                kernels/cpu/matmul.c kernels/cpu/attention.c kernels/cpu/gelu.c \
                kernels/cpu/residual.c kernels/cpu/crossentropy.c kernels/cpu/adamw.c \
                kernels/cpu/cast.c kernels/cpu/sumsq.c kernels/cpu/memory.c \
                kernels/cpu/reduce.c
KERN_OBJS   = $(B)/kernels/cpu/backend.o \
              $(foreach i,$(KERN_ISAS),$(KERN_ISA_SRCS:kernels/cpu/%.c=$(B)/kernels/cpu/$(i)/%.o))
# The job library (daemon/job): a job's options, model shape, sharding
# geometry, memory plan and admission checks, linked by the ranks and by the
# coordinator, which links nothing else of the engine (only common). Purity is
# proved by linking: test_job links only these and the common objects.
# daemon/common/ini_line.c (job file lines, over inih) is listed here, where
# inih is linked; fsdpctl links it too.
JOB_SRCS    = daemon/job/config.c daemon/job/gpt_config.c daemon/job/precision.c \
              daemon/job/shard.c daemon/job/plan.c daemon/job/job.c daemon/job/ckpt.c \
              daemon/job/safetensors.c daemon/common/ini_line.c
JOB_OBJS    = $(JOB_SRCS:%.c=$(B)/%.o) $(COMMON_SRCS:%.c=$(B)/%.o)
# what the job library needs: job files (inih), checkpoints' checksums and manifests,
# and libunistring for the text a sample prints
JOB_LDLIBS  = -linih -lxxhash -ljansson -lunistring
TRAIN_SRCS  = daemon/train/gpt.c daemon/train/adamw.c \
              daemon/train/data.c daemon/train/train.c \
              daemon/train/sample.c daemon/train/shard_rank.c \
              daemon/train/fsdp.c daemon/train/device.c daemon/train/ckpt_rank.c
NODE_SRCS   = daemon/node/supervise.c daemon/node/inventory.c
COMM_SRCS   = daemon/comm/comm.c daemon/comm/boot.c \
              daemon/comm/ring.c daemon/comm/ring_boot.c daemon/comm/ring_live.c \
              daemon/comm/ring_algo.c daemon/comm/ring_tcp.c daemon/comm/ring_shm.c \
              daemon/comm/ring_rec.c daemon/comm/ring_split.c \
              daemon/comm/shm.c daemon/comm/rec.c daemon/comm/cma.c daemon/comm/reg.c
LIB_SRCS    = $(COMMON_SRCS) $(JOB_SRCS) $(TRAIN_SRCS) $(COMM_SRCS) $(NODE_SRCS)
LIB         = $(B)/libfsdp.a

# ---- the coordinator (fsdp-coordinator) ----
# Its sources link daemon/common's objects and SQLite only: no training, comm
# or kernel object (libfsdp.a holds those; daemon/coordinator includes nothing
# of daemon/train, daemon/comm or kernels). COORD_OBJS is what the
# coordinator and its tests link.
COORD_SRCS   = daemon/coordinator/store.c daemon/coordinator/sched.c
COORD_OBJS   = $(COORD_SRCS:%.c=$(B)/%.o) $(COMMON_SRCS:%.c=$(B)/%.o)
COORD_LDLIBS = -lsqlite3 -lunistring -lpthread

BINS  = bin/fsdp-train bin/fsdp-tokenize bin/fsdp-launch bin/fsdp-coordinator bin/fsdpd
# Unit tests (tests/unit: a module through its API) and end-to-end tests
# (tests/e2e: the programs run as processes); test_bins names their binaries
# under a build directory.
UNIT_TESTS = err frame param kernels isa device boot data gpt adamw config train ckpt sample shard plan comm \
             fsdp reference supervise sched inventory job rpc store store_txn safetensors netaddr \
             ini_line file trace log hostmem
E2E_TESTS  = launch fault coordinator fsdpd cluster systemd metrics k8s slurm nogpu
test_bins  = $(UNIT_TESTS:%=$(1)/tests/test_%) $(E2E_TESTS:%=$(1)/e2e/test_%)
TEST_BINS  = $(call test_bins,$(B))
BENCH_BINS = $(B)/bench/bench_gemm $(B)/bench/bench_train $(B)/bench/bench_comm $(B)/bench/bench_fsdp \
             $(B)/bench/bench_coord $(B)/bench/bench_nodesim $(B)/bench/bench_submit \
             $(B)/bench/bench_ckpt
TESTUTIL   = $(B)/tests/unit/testutil.o
TESTUTIL_TRAIN = $(B)/tests/unit/testutil_train.o $(B)/tests/unit/refrun.o
# Test sources include Criterion's header: their objects wait for the test packages.
TEST_OBJS  = $(patsubst %.c,$(B)/%.o,$(wildcard tests/unit/*.c tests/e2e/*.c tests/fuzz/*.c))

.PHONY: all deps deps-test deps-bench deps-demo test test-build test-san test-cuda fuzz fuzz-build bench bench-cuda demo clean install
# keep objects that pattern rules chain through (tests, bench) between runs
.SECONDARY:
all: $(BINS) $(if $(HAVE_CUDA),$(CUDA_PLUGIN))
# Every test binary built (as make test builds them) and none run: `make all`
# leaves the ones already built as they were, and one run by hand after it
# tests the code it was last linked with.
test-build: deps-test all $(TEST_BINS) $(CUDA_CHECKS) \
            $(CUDA_EMU_CHECK) $(CUDNN_CHECK) $(B)/bench/bench_cuda

# One step per package set; mk/deps.sh runs one apt-get at a time when make -j
# (or a sub-make) reaches several at once.
deps:
	@sh mk/deps.sh $(BUILD_PKGS)
deps-test:
	@sh mk/deps.sh $(TEST_PKGS)
deps-bench:
	@sh mk/deps.sh $(BENCH_PKGS)
deps-demo:
	@sh mk/deps.sh $(DEMO_PKGS)

$(TEST_OBJS): | deps-test

$(B)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The kernels' levels: the psABI's x86-64 (SSE2), x86-64-v3 (AVX2) and
# x86-64-v4 (AVX-512), each -march placed after ARCH, so it wins.
$(B)/kernels/cpu/generic/%.o: kernels/cpu/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -march=x86-64 -DKERN_CPU_ISA=generic -c $< -o $@

$(B)/kernels/cpu/avx2/%.o: kernels/cpu/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -march=x86-64-v3 -DKERN_CPU_ISA=avx2 -c $< -o $@

$(B)/kernels/cpu/avx512/%.o: kernels/cpu/%.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -march=x86-64-v4 -DKERN_CPU_ISA=avx512 -c $< -o $@

$(LIB): $(LIB_SRCS:%.c=$(B)/%.o) $(KERN_OBJS)
	@rm -f $@
	ar rcs $@ $^

# report.o is the rank's report channel to fsdpd: the wire's messages and
# protobuf-c, never gRPC (the RPC block below); libunistring keeps the text
# it sends UTF-8.
# -rdynamic: the CUDA plugin it may load calls back into its error and log
# functions (device_cuda.h).
bin/fsdp-train: $(B)/daemon/train/main.o $(B)/daemon/train/report.o $(B)/proto/fsdp.pb-c.o $(LIB)
	@mkdir -p bin
	$(CC) $(LDFLAGS) -rdynamic $^ -o $@ $(LDLIBS) -lprotobuf-c -lunistring

bin/fsdp-tokenize: $(B)/daemon/train/tokenize.o $(LIB)
	@mkdir -p bin
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

bin/fsdp-launch: $(B)/daemon/node/launch.o $(LIB)
	@mkdir -p bin
	$(CC) $(LDFLAGS) $^ -o $@ -luv

$(B)/tests/test_%: $(B)/tests/unit/test_%.o $(TESTUTIL) $(TESTUTIL_TRAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

$(B)/e2e/test_%: $(B)/tests/e2e/test_%.o $(TESTUTIL) $(TESTUTIL_TRAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcriterion

# test_ckpt fails one rank's shard writes with ENOSPC (tests/e2e/fs_shim.c)
$(B)/tests/test_ckpt: | $(B)/tests/fs_shim.so
# test_launch too (a stop whose checkpoint cannot be written)
$(B)/e2e/test_launch: | $(B)/tests/fs_shim.so

# the programs with CUDA hidden: every program, the plugin (when nvcc is
# here) and a library that is not the plugin (the fake driver)
$(B)/e2e/test_nogpu: | $(BINS) bin/fsdpctl $(B)/tests/fake-cuda/libcuda.so.1

# the supervisor runs on libuv
$(B)/tests/test_supervise: LDLIBS += -luv

# bench_cuda's trace summary (tests/bench/trace.c), on records made up
$(B)/tests/test_trace: $(B)/tests/unit/test_trace.o $(B)/tests/bench/trace.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lcriterion

# fsdpd's device discovery, its GPU path run against a fake driver library
# (test_inventory puts it on inventory_probe's library path).
INVENTORY_OBJS = $(B)/daemon/node/inventory.o $(COMMON_SRCS:%.c=$(B)/%.o)
$(B)/tests/test_inventory: $(B)/tests/unit/test_inventory.o $(TESTUTIL) $(INVENTORY_OBJS) \
                           $(B)/tests/inventory_probe $(B)/tests/fake-cuda/libcuda.so.1
	$(CC) $(LDFLAGS) $(filter %.o,$^) -o $@ -ldl -lm -lcriterion
$(B)/tests/inventory_probe: $(B)/tests/unit/inventory_probe.o $(INVENTORY_OBJS)
	$(CC) $(LDFLAGS) $^ -o $@ -ldl
$(B)/tests/fake-cuda/libcuda.so.1: tests/unit/fake_libcuda.c | deps
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -Wall -Wextra -Werror $< -o $@

# The scheduler's test links what the coordinator links of it: no engine.
$(B)/tests/test_sched: $(B)/tests/unit/test_sched.o $(TESTUTIL) $(B)/daemon/coordinator/sched.o \
                       $(COMMON_SRCS:%.c=$(B)/%.o)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lm -lcriterion

# The job library's test links the job library and daemon/common and nothing
# else (no libfsdp, no testutil, no OpenMP, no oneDNN): if it links, the
# library is as pure as the coordinator needs (an explicit rule, so it wins
# over the pattern above). The grep keeps its includes so too: nothing of
# daemon/train, daemon/node or the backends but their header-only sizes and
# element-wise math (kern_math.h: the one fp32 <-> bf16 rounding).
$(B)/tests/test_job: $(B)/tests/unit/test_job.o $(JOB_OBJS)
	@mkdir -p $(dir $@)
	@! grep -En '#include "(daemon/(train|node|comm)|kernels)/' daemon/job/*.[ch] \
	  | grep -Ev '"(daemon/comm/(ring|nccl)_size|kernels/(cpu|cuda)/size|kernels/kern_math)\.h"' \
	  || { echo "daemon/job includes engine headers (above)"; exit 1; }
	$(CC) $(EXTRA_LDFLAGS) $^ -o $@ $(JOB_LDLIBS) -lm -lpthread -lcriterion

# The coordinator's tests link what the coordinator links, nothing of the
# engine (so not testutil, which reaches daemon/train).
# test_store_txn includes store.c (its static transaction helpers), so it
# links the coordinator's objects but store.o.
$(B)/tests/test_store: $(B)/tests/unit/test_store.o $(COORD_OBJS)
$(B)/tests/test_store_txn: $(B)/tests/unit/test_store_txn.o $(filter-out %/store.o,$(COORD_OBJS))
$(B)/tests/test_store $(B)/tests/test_store_txn:
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(COORD_LDLIBS) -lcriterion

$(B)/%.o: %.cu | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# kernels/cuda: position-independent (they go into the plugin) and without
# contraction, as the CPU kernels are built.
$(B)/kernels/cuda/%.o: kernels/cuda/%.cu kernels/cuda/cuda_impl.h kernels/cuda/cuda.h kernels/kern.h \
                       kernels/kern_math.h kernels/cuda/size.h | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -O3 -fmad=false -Xcompiler -fPIC,-Wall,-Wextra -c $< -o $@

# The plugin's C: the NCCL backend and the plugin's table, against CUDA's headers.
$(B)/%.pic.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -isystem $(CUDA_INC) -c $< -o $@

# Its host's symbols (err_set, log_*, param_*, comm_*) stay undefined here and
# resolve against the program that loads it.
$(CUDA_PLUGIN): $(CUDA_KERN_OBJS) $(CUDA_PIC_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libfsdp-cuda.so $^ -o $@ $(CUDA_LDLIBS)

$(B)/tests/cuda/test_cuda_kernels.o $(B)/tests/cuda/test_nccl.o: EXTRA_CFLAGS += -isystem $(CUDA_INC)
$(B)/tests/cuda/test_cuda_kernels: $(B)/tests/cuda/test_cuda_kernels.o $(CUDA_KERN_OBJS) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(CUDA_LDLIBS)
# through the plugin, as fsdp-train (-rdynamic: the plugin calls back)
$(B)/tests/cuda/test_cuda_train: $(B)/tests/cuda/test_cuda_train.o $(LIB) | $(CUDA_PLUGIN)
	$(CC) $(LDFLAGS) -rdynamic $^ -o $@ $(LDLIBS)
$(B)/tests/cuda/test_nccl: $(B)/tests/cuda/test_nccl.o $(B)/daemon/comm/nccl.pic.o \
                           $(patsubst %.cu,$(B)/%.o,$(wildcard tests/cuda/nccl_*.cu)) $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(CUDA_LDLIBS)

# cuda_emu (tests/cuda/emu/cuda_emu.h): kernels/cuda compiled by g++ for the
# CPU against CUDA's host headers, each .cu rewritten first (emu-cu.pl: the
# launches and dynamic shared arrays), with the emulator's runtime (fibers,
# the runtime calls, cuBLASLt's matmul over oneDNN). test_cuda_kernels built
# on it runs in `make test`: the kernels' logic checked where there is no
# GPU. -ffp-contract=off as -fmad=false on the GPU: kern_math.h's bits.
EMU_CXXFLAGS   = -std=c++17 -O2 -g -fPIC -ffp-contract=off -fno-math-errno -Wall -Wextra -Werror \
                 -Wno-unused-parameter -Wno-unknown-pragmas -I. -Itests/cuda/emu -isystem $(CUDA_INC)
EMU_HDRS       = tests/cuda/emu/cuda_emu.h tests/cuda/emu/mma.h kernels/cuda/cuda_impl.h \
                 kernels/cuda/cuda.h kernels/kern.h kernels/kern_math.h kernels/cuda/size.h
EMU_KERN_OBJS  = $(patsubst kernels/cuda/%.cu,$(B)/emu/kernels/cuda/%.o,$(wildcard kernels/cuda/*.cu))
CUDA_EMU_CHECK = $(if $(HAVE_CUDA),$(B)/tests/cuda/test_cuda_emu $(B)/tests/cuda/test_cuda_kernels_emu \
                 $(B)/tests/cuda/test_nccl_ranks_emu \
                 $(B)/emu/libfsdp-cuda.so)
$(B)/emu/kernels/cuda/%.cc: kernels/cuda/%.cu tests/cuda/emu/emu-cu.pl | deps
	@mkdir -p $(dir $@)
	perl tests/cuda/emu/emu-cu.pl $< $@
$(B)/emu/kernels/cuda/%.o: $(B)/emu/kernels/cuda/%.cc $(EMU_HDRS)
	$(CXX) $(EMU_CXXFLAGS) -include tests/cuda/emu/cuda_emu.h -c $< -o $@
$(B)/emu/%.o: tests/cuda/emu/%.cc tests/cuda/emu/cuda_emu.h | deps
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
# The CUDA plugin on the emulator: the same plugin objects (the NCCL backend
# and the plugin's table, compiled against CUDA's headers) over the emulated
# kernels, runtime and NCCL (nccl_emu.cc: one rank, or several over shared
# memory). FSDP_CUDA_PLUGIN pointing at it runs test_cuda_train,
# test_nccl_ranks' training, or any program's cuda device, on the CPU.
$(B)/emu/libfsdp-cuda.so: $(EMU_KERN_OBJS) $(B)/emu/cuda_emu.o $(B)/emu/nccl_emu.o $(CUDA_PIC_OBJS)
	$(CXX) -shared -Wl,-soname,libfsdp-cuda.so $^ -o $@ -ldnnl -lpthread -lm
# cuDNN's choice of engines for kernels/cuda/cudnn.cu's attention graphs,
# asked with no GPU (tests/cuda/test_cudnn_graphs.c): cudnn.cu is host code,
# built here for the CPU as it is (libcudnn.so.9 loaded by dlopen).
CUDNN_CHECK = $(if $(HAVE_CUDA),$(B)/tests/cuda/test_cudnn_graphs)
$(B)/tests/cuda/cudnn_host.o: kernels/cuda/cudnn.cu kernels/cuda/cudnn.h kernels/cuda/size.h | deps
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -x c++ -O1 -Wall -Wextra -Werror -I. -isystem $(CUDA_INC) -c $< -o $@
$(B)/tests/cuda/test_cudnn_graphs: tests/cuda/test_cudnn_graphs.c $(B)/tests/cuda/cudnn_host.o \
                                   tests/cuda/check.h
	$(CC) -std=c11 -D_GNU_SOURCE -O1 -Wall -Wextra -Werror -I. \
	  -DFSDP_CUDA_STUBS='"$(dir $(NVCC))../lib64/stubs"' $(filter %.c %.o,$^) -o $@ -ldl -lstdc++ -lm

# The emulator's own checks (a wide access misaligned or past its buffer
# stops the run, as a GPU's misaligned-address error would).
$(B)/emu/tests/test_cuda_emu.cc: tests/cuda/emu/test_cuda_emu.cu tests/cuda/emu/emu-cu.pl | deps
	@mkdir -p $(dir $@)
	perl tests/cuda/emu/emu-cu.pl $< $@
$(B)/emu/tests/test_cuda_emu.o: $(B)/emu/tests/test_cuda_emu.cc $(EMU_HDRS) tests/cuda/check.h
	$(CXX) $(EMU_CXXFLAGS) -include tests/cuda/emu/cuda_emu.h -c $< -o $@
$(B)/tests/cuda/test_cuda_emu: $(B)/emu/tests/test_cuda_emu.o $(B)/emu/cuda_emu.o
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ -o $@ -ldnnl -lpthread -lm
$(B)/emu/test_cuda_kernels.o: tests/cuda/test_cuda_kernels.c | deps-test
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKERN_CUDA_EMU -isystem $(CUDA_INC) -c $< -o $@
$(B)/tests/cuda/test_cuda_kernels_emu: $(B)/emu/test_cuda_kernels.o $(EMU_KERN_OBJS) $(B)/emu/cuda_emu.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ -o $@ $(LDLIBS)
# The NCCL backend at several ranks, on the emulator's NCCL (rank processes
# over shared memory): what a one-GPU machine cannot show.
$(B)/emu/test_nccl_ranks.o: tests/cuda/test_nccl_ranks.c | deps-test
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -isystem $(CUDA_INC) -c $< -o $@
$(B)/tests/cuda/test_nccl_ranks_emu: $(B)/emu/test_nccl_ranks.o $(B)/daemon/comm/nccl.pic.o \
                                     $(B)/emu/cuda_emu.o $(B)/emu/nccl_emu.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(B)/tests/cuda/kern_math_gpu_nofmad.o: tests/cuda/kern_math_gpu.cu | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -fmad=false -DKMG_NO_FMAD -c $< -o $@

# cudart linked statically: the program runs wherever a driver is, with no toolkit.
# The generic level's kernels: every level gives the same bits (test_kernels).
KMG_CPU_OBJS = $(B)/kernels/cpu/generic/gelu.o $(B)/kernels/cpu/generic/adamw.o \
               $(B)/kernels/cpu/generic/cast.o
$(B)/tests/cuda/kern_math_gpu $(B)/tests/cuda/kern_math_gpu_nofmad: %: %.o $(KMG_CPU_OBJS)
	$(CC) $(LDFLAGS) $^ -o $@ -L$(CUDA_LIB) -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm

# libFuzzer targets for every decoder of outside input (token, weights and job
# files, checkpoint headers and manifests, safetensors headers, RPC requests,
# the service account tokens and key sets of Kubernetes nodes), built with clang,
# ASan and UBSan in build-fuzz/. `make test` runs each
# for a fixed number of inputs from a fixed seed (a bounded regression run);
# `make fuzz` searches for FUZZ_SECONDS each, keeping what it finds in
# build-fuzz/corpus/.
FUZZ         = tokens weights jobfile rpc_requests ckpt_header ckpt_manifest safetensors_header node_jwt
FUZZ_SECONDS ?= 60
FUZZ_RUNS    ?= 20000
FUZZ_SAN     = -fsanitize=fuzzer-no-link,address,undefined -Wno-pass-failed

fuzz-build: deps-test
	@$(MAKE) -s --no-print-directory B=build-fuzz CC=clang OPT=-O1 EXTRA_CFLAGS="$(FUZZ_SAN)" \
	  $(FUZZ:%=build-fuzz/fuzz_%)

$(B)/fuzz_%: $(B)/tests/fuzz/fuzz_%.o $(B)/tests/fuzz/fuzz.o $(LIB)
	$(CC) -fsanitize=fuzzer,address,undefined -fopenmp $^ -o $@ $(LDLIBS)

# ---- the wire and the RPC layer (proto/, daemon/common/rpc*) ---------------
# protoc-c generates C from proto/*.proto into $(B)/proto/ (never committed);
# objects include it as "proto/fsdp.pb-c.h". Everything that speaks gRPC is in
# its own archive, RPC_LIB, linked with RPC_LDLIBS only by the programs and
# tests that use it: the training binaries never link gRPC.
PROTOS      = proto/fsdp.proto proto/health.proto
PROTO_HDRS  = $(PROTOS:%.proto=$(B)/%.pb-c.h)
PROTO_OBJS  = $(PROTOS:%.proto=$(B)/%.pb-c.o)
RPC_SRCS    = daemon/common/rpc.c daemon/common/rpc_server.c daemon/common/rpc_client.c \
              daemon/common/rpc_keys.c daemon/common/rpc_jwt.c daemon/common/rpc_guard.c daemon/common/ticket.c \
              daemon/common/text.c
RPC_OBJS    = $(RPC_SRCS:%.c=$(B)/%.o)
RPC_LIB     = $(B)/libfsdp_rpc.a
RPC_LDLIBS  = -lgrpc -lgpr -lprotobuf-c -luv -ljwt -ljansson -lcrypto
# /metrics (the coordinator and fsdpd only): libmicrohttpd serves it
METRICS_OBJS   = $(B)/daemon/common/metrics.o
METRICS_LDLIBS = -lmicrohttpd
CFLAGS     += -I$(B)

# one protoc-c run makes both files; the .c is the grouped rule's other target
$(B)/proto/%.pb-c.c $(B)/proto/%.pb-c.h: proto/%.proto | deps
	@mkdir -p $(B)/proto
	protoc-c --proto_path=. --c_out=$(B) $<

$(B)/proto/%.pb-c.o: $(B)/proto/%.pb-c.c
	$(CC) $(CFLAGS) -c $< -o $@

# generated headers first (after that, -MMD's dependency files track them)
$(RPC_OBJS) $(PROTO_OBJS) $(B)/tests/unit/test_rpc.o $(B)/tests/fuzz/fuzz_rpc_requests.o \
  $(B)/tests/fuzz/fuzz_node_jwt.o \
  $(B)/daemon/train/report.o $(B)/tests/unit/test_train.o: | $(PROTO_HDRS)

# test_train also reads what a rank writes on its report channel (report.o:
# the wire's messages and protobuf-c, as bin/fsdp-train links them)
$(B)/tests/test_train: $(B)/tests/unit/test_train.o $(B)/daemon/train/report.o \
                       $(B)/proto/fsdp.pb-c.o $(TESTUTIL) $(TESTUTIL_TRAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lprotobuf-c -lunistring -lcriterion

$(RPC_LIB): $(RPC_OBJS) $(PROTO_OBJS)
	@rm -f $@
	ar rcs $@ $^

# linked with daemon/common alone: the layer needs nothing of the engine
$(B)/tests/test_rpc: $(B)/tests/unit/test_rpc.o $(TESTUTIL) $(RPC_LIB) $(COMMON_SRCS:%.c=$(B)/%.o)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(RPC_LDLIBS) -lunistring -lm -lpthread -lcriterion

# the fuzz target needs the generated messages and protobuf-c, nothing of gRPC
$(B)/fuzz_rpc_requests: $(B)/tests/fuzz/fuzz_rpc_requests.o $(B)/tests/fuzz/fuzz.o $(PROTO_OBJS) $(LIB)
	$(CC) -fsanitize=fuzzer,address,undefined -fopenmp $^ -o $@ $(LDLIBS) -lprotobuf-c
# the nodes' service account tokens: rpc_jwt.c and what it reads files with
$(B)/fuzz_node_jwt: $(B)/tests/fuzz/fuzz_node_jwt.o $(B)/tests/fuzz/fuzz.o $(B)/daemon/common/rpc_jwt.o \
                    $(B)/daemon/common/rpc.o $(LIB)
	$(CC) -fsanitize=fuzzer,address,undefined -fopenmp $^ -o $@ $(LDLIBS) $(RPC_LDLIBS)
# ---- end of the RPC block ----------------------------------------------------

# ---- fsdp-coordinator: the store, the scheduler and admission (the job
# library) behind the RPC layer; nothing of the engine (COORD_BIN_OBJS).
COORD_SVC_SRCS = daemon/coordinator/coord.c daemon/coordinator/coord_rpc.c daemon/coordinator/coord_ckpt.c \
                 daemon/coordinator/coord_export.c daemon/coordinator/coord_metrics.c \
                 daemon/coordinator/main.c
COORD_SVC_OBJS = $(COORD_SVC_SRCS:%.c=$(B)/%.o)
COORD_BIN_OBJS = $(COORD_SVC_OBJS) $(sort $(COORD_OBJS) $(JOB_OBJS)) $(METRICS_OBJS) $(RPC_LIB)
$(COORD_SVC_OBJS) $(B)/tests/e2e/test_coordinator.o: | $(PROTO_HDRS)
# the control plane's rates: the coordinator driven by concurrent RPC clients
$(B)/tests/bench/bench_coord.o: | $(PROTO_HDRS)
$(B)/bench/bench_coord: $(B)/tests/bench/bench_coord.o $(B)/tests/bench/benchutil.o $(LIB) $(RPC_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS) $(RPC_LDLIBS)
# how many nodes' heartbeats the coordinator sustains: one process plays them
# with gRPC's C core directly (asynchronous calls, not rpc.h's blocking client)
$(B)/tests/bench/bench_nodesim.o: | $(PROTO_HDRS)
$(B)/bench/bench_nodesim: $(B)/tests/bench/bench_nodesim.o $(B)/tests/bench/benchutil.o $(RPC_LIB) \
                          $(COMMON_SRCS:%.c=$(B)/%.o)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(RPC_LDLIBS) -lm -lpthread
# the coordinator's end-to-end test plays users and nodes through the RPC
# client; it runs bin/fsdp-coordinator, which `make test` builds with $(BINS)
# (not a prerequisite: test-san's sub-make would rebuild it with sanitizers)
$(B)/e2e/test_coordinator: $(B)/tests/e2e/test_coordinator.o $(B)/tests/e2e/cluster.o $(TESTUTIL) \
                           $(TESTUTIL_TRAIN) $(LIB) $(RPC_LIB) $(B)/tests/fs_shim.so
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(LDLIBS) $(RPC_LDLIBS) -lsqlite3 -lcriterion
# an LD_PRELOAD shim: fsync of chosen files takes a known time (a commit on the pool at a
# stop); a file system without RENAME_NOREPLACE and hard links (fsdpctl export)
$(B)/tests/fs_shim.so: tests/e2e/fs_shim.c | deps
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -Wall -Wextra -Werror $< -o $@ -ldl
bin/fsdp-coordinator: $(COORD_BIN_OBJS)
	@mkdir -p bin
	$(CC) $(EXTRA_LDFLAGS) $^ -o $@ $(RPC_LDLIBS) $(METRICS_LDLIBS) $(COORD_LDLIBS) $(JOB_LDLIBS) -lm

# ---- fsdpctl (client/) ------------------------------------------------------
# The client links only the wire: its own objects, RPC_LIB and five objects
# of daemon/common (errors, log lines, the tunables the log reads, job file
# lines, the checks before an export's file is written), plus inih
# for job files, jansson for --output json and libunistring for the display
# width of table cells in UTF-8. No libfsdp, no OpenMP: the nm
# check below fails the build if an engine symbol ever gets in.
# (`all:` was read before this block, so it is told of the program here.)
CLIENT_SRCS        = client/fsdpctl.c client/spec.c client/table.c client/pbjson.c
CLIENT_OBJS        = $(CLIENT_SRCS:%.c=$(B)/%.o)
CLIENT_COMMON_OBJS = $(B)/daemon/common/err.o $(B)/daemon/common/log.o $(B)/daemon/common/param.o \
                     $(B)/daemon/common/ini_line.o $(B)/daemon/common/file.o
BINS      += bin/fsdpctl
E2E_TESTS += fsdpctl
all: bin/fsdpctl

$(CLIENT_OBJS) $(B)/tests/e2e/test_fsdpctl.o: | $(PROTO_HDRS)

bin/fsdpctl: $(CLIENT_OBJS) $(RPC_LIB) $(CLIENT_COMMON_OBJS)
	@mkdir -p bin
	$(CC) $(EXTRA_LDFLAGS) $^ -o $@ $(RPC_LDLIBS) -linih -ljansson -lunistring -lpthread
	@! nm $@ | grep -E ' [TtDdBb] (kern|gpt|fsdp|comm|train|config|job|plan|shard|mem|sched|supervise)_[a-z]' \
	  || { rm -f $@; echo "bin/fsdpctl links engine code (above): it must link only the wire"; exit 1; }

# The fake coordinator and Node service run in the test process on the RPC
# layer; bin/fsdpctl runs as a process (built by `make test` with $(BINS); not
# a prerequisite here, so test-san's sub-make never rebuilds bin/fsdpctl
# with the sanitizers); jansson parses its --output json.
$(B)/e2e/test_fsdpctl: $(B)/tests/e2e/test_fsdpctl.o $(TESTUTIL) $(RPC_LIB) $(CLIENT_COMMON_OBJS) \
                       $(B)/tests/fs_shim.so
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ $(RPC_LDLIBS) -linih -ljansson -lm -lpthread -lcriterion
# ---- end of the fsdpctl block -----------------------------------------------

# ---- fsdpd, the node daemon (daemon/node) ------------------------------------
# It speaks the wire (RPC_LIB) and supervises ranks with supervise.c, the code
# fsdp-launch uses; it links daemon/common and nothing of the engine (no
# kern_, fsdp_, gpt_ symbols: the rule checks with nm).
FSDPD_SRCS = daemon/node/fsdpd.c daemon/node/agent.c daemon/node/ranks.c daemon/node/logs.c \
             daemon/node/workdir.c daemon/node/supervise.c daemon/node/inventory.c
FSDPD_OBJS = $(FSDPD_SRCS:%.c=$(B)/%.o)
$(FSDPD_OBJS) $(B)/tests/e2e/test_fsdpd.o: | $(PROTO_HDRS)
bin/fsdpd: $(FSDPD_OBJS) $(METRICS_OBJS) $(RPC_LIB) $(COMMON_SRCS:%.c=$(B)/%.o) \
           $(B)/daemon/common/ini_line.o
	@mkdir -p bin
	$(CC) $(EXTRA_LDFLAGS) $^ -o $@ $(RPC_LDLIBS) $(METRICS_LDLIBS) -linih -lunistring -ldl -lm -lpthread
	@! nm $@ | grep -E ' [TtDdBb] (kern_|fsdp_[a-z]|gpt_|train_|comm_)' \
	  || { echo "bin/fsdpd links engine code (above)"; rm -f $@; exit 1; }

# The test runs a fake coordinator (RPC_LIB) and starts bin/fsdpd and, through
# it, bin/fsdp-train; it links the engine only for tu_token_file.
$(B)/e2e/test_fsdpd: $(B)/tests/e2e/test_fsdpd.o $(TESTUTIL) $(TESTUTIL_TRAIN) $(RPC_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(RPC_LDLIBS) $(LDLIBS) -lcriterion

# The whole service as processes (tests/e2e/cluster.c starts them): it runs
# bin/fsdp-coordinator, bin/fsdpd, bin/fsdpctl and bin/fsdp-train, which
# `make test` builds with $(BINS).
# its cuda jobs: an fsdpd whose inventory finds the fake driver's GPUs and
# whose ranks run the emulated plugin ($(B)/emu, when nvcc built it)
$(B)/e2e/test_cluster: $(B)/tests/e2e/test_cluster.o $(B)/tests/e2e/cluster.o $(TESTUTIL) \
                       $(TESTUTIL_TRAIN) $(LIB) | $(B)/tests/fake-cuda/libcuda.so.1 \
                       $(B)/tests/fs_shim.so
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lsqlite3 -lcriterion
# deploy/slurm's batch script under a real Slurm (munged, slurmctld, slurmd
# started by tests/e2e/test_slurm.c).
$(B)/e2e/test_slurm: $(B)/tests/e2e/test_slurm.o $(B)/tests/e2e/cluster.o $(TESTUTIL) \
                     $(TESTUTIL_TRAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lsqlite3 -lcriterion
# deploy/k8s checked offline and strictly against the Kubernetes API schemas
# (tests/k8s/check.mjs over npm's kubernetes-models, installed from its lock).
K8S_MODULES = tests/k8s/node_modules/.package-lock.json
$(K8S_MODULES): tests/k8s/package.json tests/k8s/package-lock.json | deps-test
	@command -v npm >/dev/null || sh mk/deps.sh npm
	cd tests/k8s && npm ci --no-audit --no-fund --loglevel=error
$(B)/e2e/test_k8s: $(B)/tests/e2e/test_k8s.o $(TESTUTIL) | $(K8S_MODULES)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ -lm -lcriterion
# /metrics of a coordinator and an fsdpd running a job, checked by promtool
# and scraped by a prometheus server on loopback (tests/e2e/test_metrics.c).
$(B)/e2e/test_metrics: $(B)/tests/e2e/test_metrics.o $(B)/tests/e2e/cluster.o $(TESTUTIL) \
                       $(TESTUTIL_TRAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lsqlite3 -lcriterion
# deploy/systemd's units checked by systemd-analyze (offline) and their
# command lines run as systemd would (tests/e2e/test_systemd.c).
$(B)/e2e/test_systemd: $(B)/tests/e2e/test_systemd.o $(B)/tests/e2e/cluster.o $(TESTUTIL) \
                       $(TESTUTIL_TRAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lsqlite3 -lcriterion
# ---- end of the fsdpd block --------------------------------------------------

fuzz: fuzz-build
	@for t in $(FUZZ); do mkdir -p build-fuzz/corpus/$$t; \
	  build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus/$$t \
	    tests/fuzz/corpus/$$t || exit 1; done

# through the plugin, as fsdp-train (-rdynamic: the plugin calls back)
# FSDP_BENCH_TRACE's CUPTI glue sees cupti.h where CUDA is installed (it
# opens libcupti with dlopen: nothing of CUDA is linked)
$(B)/bench/bench_cuda: $(B)/tests/bench/bench_cuda.o $(B)/tests/bench/trace.o \
                       $(B)/tests/bench/trace_cupti.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -rdynamic $^ -o $@ $(LDLIBS)
$(B)/tests/bench/trace_cupti.o: EXTRA_CFLAGS += $(if $(HAVE_CUDA),-isystem $(CUDA_INC))

$(B)/bench/%: $(B)/tests/bench/%.o $(B)/tests/bench/benchutil.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -ldl

# The fuzz targets' bounded runs go side by side (independent processes, one
# thread each), then the test binaries one after another.
test: deps-test $(BINS) $(if $(HAVE_CUDA),$(CUDA_PLUGIN)) $(TEST_BINS) $(CUDA_CHECKS) $(CUDA_EMU_CHECK) \
      $(CUDNN_CHECK) \
      $(B)/bench/bench_cuda fuzz-build
	@for t in $(FUZZ); do rm -rf build-fuzz/run/$$t build-fuzz/fuzz_$$t.rc; mkdir -p build-fuzz/run/$$t; \
	  { build-fuzz/fuzz_$$t -seed=1 -runs=$(FUZZ_RUNS) build-fuzz/run/$$t tests/fuzz/corpus/$$t \
	    >build-fuzz/fuzz_$$t.log 2>&1; echo $$? >build-fuzz/fuzz_$$t.rc; } & done; wait; \
	for t in $(FUZZ); do [ "$$(cat build-fuzz/fuzz_$$t.rc)" = 0 ] || { tail -n 40 build-fuzz/fuzz_$$t.log; exit 1; }; \
	  echo "fuzz_$$t: $(FUZZ_RUNS) inputs, no crash"; done
	@[ -n "$(CUDA_CHECKS)" ] || echo "note: $(NVCC) not found: the CUDA checks were not built"
	@[ -z "$(CUDA_CHECKS)" ] || $(B)/tests/cuda/test_cuda_train --selfcheck-cpu
	@[ -z "$(CUDNN_CHECK)" ] || $(CUDNN_CHECK) | grep -E '^FAIL|skipped|checks,'; [ -z "$(CUDNN_CHECK)" ] || $(CUDNN_CHECK) >/dev/null
	@[ -z "$(CUDA_EMU_CHECK)" ] || FSDP_CUDA_PLUGIN=$(CURDIR)/$(B)/emu/libfsdp-cuda.so sh tests/cuda/emu/run.sh \
	  forward:$(B)/tests/cuda/test_cuda_emu \
	  forward:$(B)/tests/cuda/test_cuda_kernels_emu random+deferred:$(B)/tests/cuda/test_cuda_kernels_emu \
	  forward+ahead:$(B)/tests/cuda/test_cuda_train forward+deferred:$(B)/tests/cuda/test_nccl_ranks_emu \
	  forward+ahead:$(B)/tests/cuda/test_nccl_ranks_emu
	@FSDP_TEST_BUILD=$(B) sh tests/run.sh $(TEST_BINS)

# The shared element-wise math on a GPU against the CPU kernels (passes, saying
# so, where there is no GPU).
# On a GPU machine without this project's build packages: tests/cuda/gpu-pack.sh
# here, then .gpu/gpu-run.sh there.
test-cuda: $(CUDA_CHECKS) $(if $(HAVE_CUDA),$(CUDA_PLUGIN))
	@[ -n "$(CUDA_CHECKS)" ] || { echo "test-cuda: $(NVCC) not found"; exit 1; }
	@for t in $(CUDA_CHECKS); do $$t || exit 1; done

# The same tests built with AddressSanitizer and UBSan, in their own build dir.
# The programs the tests run are built sanitized too (into bin/, where the
# tests find them); afterwards they are built again from $(B), pass or fail,
# so that a later `make` or `make demo` does not run sanitized programs.
# -DTU_SLOW=4 gives the end-to-end tests' limits room for programs ~8x slower
# (tests/unit/testutil.h).
test-san: deps-test $(BINS)
	$(MAKE) B=build-san OPT=-O1 EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -DTU_SLOW=4" \
	  EXTRA_LDFLAGS="-fsanitize=address,undefined" $(call test_bins,build-san)
	FSDP_TEST_BUILD=build-san ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=halt_on_error=1 sh tests/run.sh $(call test_bins,build-san); st=$$?; \
	  rm -f $(BINS) $(CUDA_PLUGIN); $(MAKE) $(BINS) $(if $(HAVE_CUDA),$(CUDA_PLUGIN)) >/dev/null; exit $$st

bench: deps-bench $(BINS) $(BENCH_BINS)
	@BENCH_BUILD=$(B) sh tests/bench/run.sh

# GPU training against PyTorch on the same GPU (tests/bench/bench_cuda.c), for
# gpt2-124m and gpt2-774m at T = 1024; BENCH_CUDA_B* choose B for the device.
# On a lent GPU machine: tests/cuda/gpu-pack.sh here, then
# GPU_CHECKS= GPU_BENCH=1 .gpu/gpu-run.sh there.
BENCH_CUDA_B124 ?= 16
BENCH_CUDA_B774 ?= 8
BENCH_CUDA_STEPS ?= 20
bench-cuda: $(B)/bench/bench_cuda $(if $(HAVE_CUDA),$(CUDA_PLUGIN))
	$(B)/bench/bench_cuda gpt2-124m $(BENCH_CUDA_B124) 1024 $(BENCH_CUDA_STEPS)
	$(B)/bench/bench_cuda gpt2-774m $(BENCH_CUDA_B774) 1024 $(BENCH_CUDA_STEPS)
	FSDP_CUDA_ATTN_GEMM=1 FSDP_BENCH_NO_PEER=1 \
	  $(B)/bench/bench_cuda gpt2-124m $(BENCH_CUDA_B124) 1024 $(BENCH_CUDA_STEPS)
	$(B)/bench/bench_cuda --ops gpt2-124m $(BENCH_CUDA_B124) 1024

demo: deps-demo $(BINS)
	@sh mk/demo.sh

# `make install` (PREFIX, DESTDIR as packagers expect): the programs, the
# systemd units (deploy/systemd, ExecStart pointing at BINDIR), the sysusers
# file for the user fsdpd runs as, into DATADIR the Prometheus alerting
# rules (deploy/prometheus), the Slurm batch script (deploy/slurm, FSDP_BIN's
# default BINDIR) and the Kubernetes manifests (deploy/k8s), and the
# documentation.
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
# the CUDA plugin, where the programs look for it: ../lib/fsdpd beside BINDIR
PLUGINDIR   ?= $(dir $(BINDIR))lib/fsdpd
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DOCDIR      ?= $(PREFIX)/share/doc/fsdpd
DATADIR     ?= $(PREFIX)/share/fsdpd
install: $(BINS) $(if $(HAVE_CUDA),$(CUDA_PLUGIN))
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(DOCDIR) \
	  $(DESTDIR)$(DATADIR)/prometheus $(DESTDIR)$(DATADIR)/slurm $(DESTDIR)$(DATADIR)/k8s
	install -m 0755 $(BINS) $(DESTDIR)$(BINDIR)/
	$(if $(HAVE_CUDA),install -d $(DESTDIR)$(PLUGINDIR) && install -m 0755 $(CUDA_PLUGIN) $(DESTDIR)$(PLUGINDIR)/)
	for u in fsdp-coordinator fsdpd; do \
	  sed 's|@BINDIR@|$(BINDIR)|g' deploy/systemd/$$u.service >$(DESTDIR)$(UNITDIR)/$$u.service && \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$u.service || exit 1; done
	install -m 0644 deploy/systemd/fsdpd.sysusers.conf $(DESTDIR)$(SYSUSERSDIR)/fsdpd.conf
	install -m 0644 deploy/prometheus/fsdp-alerts.yml $(DESTDIR)$(DATADIR)/prometheus/
	sed 's|/usr/local/bin|$(BINDIR)|g' deploy/slurm/fsdp.sbatch >$(DESTDIR)$(DATADIR)/slurm/fsdp.sbatch
	chmod 0755 $(DESTDIR)$(DATADIR)/slurm/fsdp.sbatch
	install -m 0644 deploy/k8s/*.yaml $(DESTDIR)$(DATADIR)/k8s/
	install -m 0644 README.md docs/*.md $(DESTDIR)$(DOCDIR)/

clean:
	rm -rf $(B) bin lib

-include $(shell find $(B) -name '*.d' 2>/dev/null)
