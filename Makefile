# Everything a new machine needs: `make demo` (set up, then prepare → train → evaluate) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Named corpora come from the shared mirror when it is there, and are downloaded otherwise.
export MT_MIRROR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)

DATA   := data/prepared/multi30k_de_en
DEMO_DATA := data/prepared/multi30k_de_en_4k
RUN    := runs/demo

.PHONY: install test test-any-cpu browser-test demo recipe bench bench-compare gpu-check gpu-bench lint clean

install: $(VENV)/.installed

# torch first and pinned: on its own, pip would resolve an unpinned torch to a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,export,serve,documents]'
	touch $@

# The suite, a worker per core; then, on a CPU with AVX-512, the tests whose numbers hang on the CPU's kernels
# (pytest -m numerics) again as an AVX2-only CPU computes them, so that their verdict holds on either kind. The
# tiny models the tests train are made once for both (MT_TEST_MODELS: tests/conftest.py, made_once).
AVX2_KERNELS := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2
HAS_AVX512 := $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo yes)
# the files that mark some numerics tests: collecting every other file too cost each worker of that pass seconds
NUMERICS_FILES = $(shell grep -rl --include='test_*.py' numerics tests)
# worksteal: a worker that runs out of tests takes some of the other's, where whole files left one waiting at the end
SUITE := $(BIN)/python -m pytest -q -n auto --dist worksteal
# Bytecode is written even where the environment says not to: pytest keeps each test file as rewritten for its
# asserts, else every worker of both passes rewrites all of them again (9 s a worker on a 2 GHz core).
test: install
	@unset PYTHONDONTWRITEBYTECODE; export MT_TEST_MODELS="$$(mktemp -d)"; trap 'rm -rf "$$MT_TEST_MODELS"' EXIT; \
	set -e; set -x; \
	$(SUITE); \
	$(if $(HAS_AVX512),$(AVX2_KERNELS) $(SUITE) -m numerics $(NUMERICS_FILES))

# The whole suite as other CPUs compute it, one after another (about 9 minutes on 2 cores): AVX2 only; AVX2 with
# MKL's products, as on an Intel CPU; and, on an AVX-512 CPU, AVX-512 without BF16. Run it after changing a fast
# path or a test that trains a model: -m numerics is the part of it that make test repeats.
test-any-cpu: install
	$(AVX2_KERNELS) $(SUITE)
	$(AVX2_KERNELS) MT_CPU_MATMUL=mkl $(SUITE)
	$(if $(HAS_AVX512),ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI CT2_FORCE_CPU_ISA=AVX512 MT_CPU_MATMUL=mkl $(SUITE))

# The page of mt serve in headless Chromium (Debian's chromium and chromium-driver; make test skips it without them).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser-test: install
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium chromium-driver; }
	$(BIN)/python -m pytest -q tests/serve/test_page.py

lint: install
	$(BIN)/ruff check mt tests

demo: install
	$(BIN)/mt prepare multi30k --src de --tgt en --vocab-size 4000 --out $(DEMO_DATA)
	$(BIN)/mt train configs/demo.yaml --out $(RUN) --set data=$(DEMO_DATA)
	$(BIN)/mt evaluate --checkpoint $(RUN)/best.pt --src $(DEMO_DATA)/test.src.txt --ref $(DEMO_DATA)/test.tgt.txt
	@echo "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche." | $(BIN)/mt translate --checkpoint $(RUN)/best.pt

# A results recipe, NAME=CORPUS_SRC_TGT with configs/NAME.yaml (e.g. NAME=multi30k_en_de): prepare, train (or
# continue an interrupted run), average the last checkpoints (how many: chosen on valid), choose beam and length penalty on valid, report on
# test. Leaves runs/NAME/final.pt and runs/NAME/report.json. SEED=N trains with another seed into runs/NAME_sN.
# TRAIN_SET passes settings on to a new run's training (TRAIN_SET="--set train.max_minutes=3" for a short one).
# A config with train.members: N trains N models into runs/NAME/member-*, and final.pt is their ensemble.
# NAME=CORPUS_SRC_TGT_both: one model of both directions (train.two_way); also final.TGT-SRC.pt, report.TGT-SRC.json.
# NAME=CORPUS_SRC_TGT_channel: the recipes of both directions with one SEED (each skipped where its report.json is),
# then each one's final.pt reranked by the other's as its channel model (mt ensemble): final.channel.pt and
# report.channel.json in each of the two runs. The two-direction system's training is both runs'.
NAME   ?= multi30k_de_en
SEED   ?= 1
AVERAGE ?= 1,2,4,8
LANGS  = $(subst _, ,$(NAME))
TWO_WAY = $(filter both,$(word 4,$(LANGS)))
BACK    = $(word 3,$(LANGS))-$(word 2,$(LANGS))
SEEDED  = $(if $(filter-out 1,$(SEED)),_s$(SEED))
RECIPE_RUN = runs/$(NAME)$(SEEDED)
CHANNEL = $(filter channel,$(word 4,$(LANGS)))
FORTH   = $(word 1,$(LANGS))_$(word 2,$(LANGS))_$(word 3,$(LANGS))
BACKWARD = $(word 1,$(LANGS))_$(word 3,$(LANGS))_$(word 2,$(LANGS))
# On a machine with a GPU (nvidia-smi found; GPU= says there is none), configs/NAME.gpu.yaml where there is one.
GPU    ?= $(if $(shell command -v nvidia-smi),yes)
CONFIG  = configs/$(NAME)$(if $(and $(GPU),$(wildcard configs/$(NAME).gpu.yaml)),.gpu).yaml
# NO_VENV=1: the Python found here (PYTHON) with the repo on its path, nothing installed, as make gpu-check runs; for
# a lent GPU machine that has torch and no package index.
ON_PATH = PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}
RUN_PY  = $(if $(NO_VENV),$(ON_PATH) $(PYTHON),$(BIN)/python)
MT      = $(if $(NO_VENV),$(ON_PATH) $(PYTHON) -m mt,$(BIN)/mt)
SETUP   = $(if $(NO_VENV),,install)
# On a CPU, one single-thread process per core, each taking an equal share of the config's batch (train.max_tokens):
# more steps an hour than one process on all the cores. PROCS=1 trains in one process, as on a GPU.
# (nproc without OMP_NUM_THREADS, which it would otherwise report: the cores, not a thread setting.)
PROCS  ?= $(if $(GPU),1,$(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc))
SHARE   = $$($(RUN_PY) -c "from mt.config import load_config; print(load_config('$(CONFIG)').train.max_tokens // $(PROCS))")
TRAIN   = $(if $(filter 1,$(PROCS)),$(MT) train,OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node $(PROCS) -m mt train)
SPLIT   = $(if $(filter 1,$(PROCS)),,--set train.max_tokens=$(SHARE) --set train.threads=1)

ifneq ($(CHANNEL),)
recipe: $(SETUP)
	@test -f configs/$(FORTH).yaml -a -f configs/$(BACKWARD).yaml -a -z "$(word 5,$(LANGS))" || \
		{ echo "NAME=$(NAME) needs configs/$(FORTH).yaml and configs/$(BACKWARD).yaml"; exit 2; }
	test -f runs/$(FORTH)$(SEEDED)/report.json || $(MAKE) recipe NAME=$(FORTH) SEED=$(SEED)
	test -f runs/$(BACKWARD)$(SEEDED)/report.json || $(MAKE) recipe NAME=$(BACKWARD) SEED=$(SEED)
	$(call with_channel,runs/$(FORTH)$(SEEDED),runs/$(BACKWARD)$(SEEDED))
	$(call with_channel,runs/$(BACKWARD)$(SEEDED),runs/$(FORTH)$(SEEDED))
else
recipe: $(SETUP)
	@test -f $(CONFIG) || { echo "no $(CONFIG)"; exit 2; }
	@test -z "$(word 5,$(LANGS))" -a -n "$(word 3,$(LANGS))" -a "$(word 4,$(LANGS))" = "$(TWO_WAY)" || \
		{ echo "NAME=$(NAME): a recipe is named CORPUS_SRC_TGT (e.g. multi30k_en_de), CORPUS_SRC_TGT_both or CORPUS_SRC_TGT_channel"; exit 2; }
	test -f data/prepared/$(NAME)/meta.json || $(MT) prepare $(word 1,$(LANGS)) --src $(word 2,$(LANGS)) \
		--tgt $(word 3,$(LANGS)) $(if $(TWO_WAY),--two-way) --out data/prepared/$(NAME)
	if [ -n "$$(ls -d $(RECIPE_RUN)/last.pt $(RECIPE_RUN)/checkpoint-*.pt $(RECIPE_RUN)/member-* 2>/dev/null)" ]; then $(TRAIN) --resume --out $(RECIPE_RUN); \
	else $(TRAIN) $(CONFIG) --out $(RECIPE_RUN) --set train.seed=$(SEED) $(SPLIT) $(TRAIN_SET); fi
	$(MT) average $(RECIPE_RUN) --last $(AVERAGE) --out $(RECIPE_RUN)/final.pt
	$(MT) tune --checkpoint $(RECIPE_RUN)/final.pt --out $(RECIPE_RUN)/final.pt
	$(MT) report $(RECIPE_RUN)
	$(if $(TWO_WAY),$(MT) tune --checkpoint $(RECIPE_RUN)/final.pt --to $(word 2,$(LANGS)) --out $(RECIPE_RUN)/final.$(BACK).pt)
	$(if $(TWO_WAY),$(MT) report $(RECIPE_RUN) --checkpoint $(RECIPE_RUN)/final.$(BACK).pt)
endif

# RUN $(1)'s final.pt, reranked by RUN $(2)'s (the reverse direction): tuned on valid, reported on test.
define with_channel
$(MT) ensemble $(1)/final.pt $(2)/final.pt --out $(1)/final.channel.pt
$(MT) tune --checkpoint $(1)/final.channel.pt --out $(1)/final.channel.pt
$(MT) report $(1) --checkpoint $(1)/final.channel.pt
endef

# The standard grids, one process per setting; rewrite the benchmark tables (translation, training) in docs/.
bench: install
	test -f $(DATA)/meta.json || $(BIN)/mt prepare multi30k --src de --tgt en --out $(DATA)
	$(BIN)/mt bench translate --grid --readme docs/benchmarks.md
	$(BIN)/mt bench train --grid --readme docs/benchmarks.md --data $(DATA)

# The whole pipeline on this machine's GPU, one JSON report (benchmarks/gpu_check.py). It runs with the Python and
# torch found here and installs nothing (no install, no .venv): a GPU machine may have torch and no package index.
# Multi30k from MT_MIRROR=DIR (holding multi30k/*.gz); GPU_CHECK=--quick for a shorter run. Without CUDA it says so.
gpu-check:
	@PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) benchmarks/gpu_check.py $(GPU_CHECK)

# mt against Hugging Face's MarianMTModel on this machine's GPU, side by side (benchmarks/gpu_bench.py): shapes,
# training throughput and compile, decoding, in about 8 minutes; a JSON line per result and one report in
# GPU_BENCH_OUT. As gpu-check: the Python and torch found here, nothing installed, Multi30k from MT_MIRROR.
# GPU_BENCH passes options: --quick, --budget SECONDS, --checkpoint C, --data DIR.
GPU_BENCH_OUT ?= runs/gpu-bench.json
gpu-bench:
	@PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) benchmarks/gpu_bench.py --out $(GPU_BENCH_OUT) $(GPU_BENCH)

# mt against Hugging Face and CTranslate2, side by side: translation (generate; CTranslate2 float32 and int8) and
# training (MarianMTModel) per preset, one JSON line per system (installs the optional extra where it is missing).
# COMPARE and COMPARE_TRAIN pass options on (tests run it tiny: COMPARE_PRESETS=tiny COMPARE="--batch 2 --runs 1").
COMPARE_PRESETS ?= small base
COMPARE ?= --batch 64 --int8
COMPARE_TRAIN ?=
bench-compare: install
	$(BIN)/python -c "import transformers, ctranslate2" 2>/dev/null || $(BIN)/pip install --quiet -e '.[bench]'
	for preset in $(COMPARE_PRESETS); do for beam in 1 4; do \
		$(BIN)/python benchmarks/compare_translate.py --preset $$preset --beam $$beam $(COMPARE) || exit 1; done; \
		$(BIN)/python benchmarks/compare_train.py --preset $$preset $(COMPARE_TRAIN) || exit 1; done

clean:
	rm -rf $(VENV) runs data/prepared
