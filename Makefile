# make reproduce      every stage on the embedded CPU default + the paper's table and figures
# make test           the test suite
# make stage STAGE=03 CONFIG=embedded    run one stage where it is stale (and whatever it needs); ARGS=--force reruns it
# make stage STAGE=03 SET="k=2"          the same with a value changed: the run goes to runs/embedded-k2/
#                                        (SET holds KEY=VALUE assignments; a value may hold spaces)
# make reproduce CONFIG=tiny             another params/<CONFIG>.yaml
# make report CONFIG=embedded            the run's report site, site/<CONFIG>/index.html
# make model MODEL=gemma-3-270m          an embedded model (qwen2.5-coder-0.5b-instruct, smollm2-135m-instruct)
# make notebooks / make readme            parameters cells from the schema / the README's tables from their files
# make campaign CAMPAIGN=paper           params/campaign-<CAMPAIGN>.yaml: its configurations, then its Table 1,
#                                        Figures 1-3 and live-vs-published (ARGS="--executor ray" etc.)
# Staleness is decided by replaylib.run from the parameters and the code and files each stage used as it ran,
# so `make reproduce` twice runs nothing the second time.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= embedded
STAGE  ?=
SET    ?=
CAMPAIGN ?= tiny
MODEL  ?= qwen2.5-coder-0.5b-instruct
ARGS   ?=
TEST_WORKERS ?= 2
PIP_FLAGS ?=

.PHONY: reproduce report paper campaign test browser stage setup model notebooks readme lab verify clean

reproduce: export REPLAYLIB_CONFIG := $(CONFIG)
reproduce: setup
	$(BIN)/python -m replaylib.models fetch --if-used "params/$$REPLAYLIB_CONFIG.yaml"
	$(BIN)/python -m replaylib.run params/paper.yaml
	$(BIN)/python -m replaylib.run "params/$$REPLAYLIB_CONFIG.yaml" --html

report: setup
	$(BIN)/python -m replaylib.report --html runs/$(CONFIG)

paper: setup
	$(BIN)/python -m replaylib.run params/paper.yaml

# an embedded model is fetched only by campaigns that use it (tiny and hub models need no fetch)
campaign: setup
	for f in $$($(BIN)/python -m replaylib.campaign params/campaign-$(CAMPAIGN).yaml --list-params); do $(BIN)/python -m replaylib.models fetch --if-used "$$f" || exit 1; done
	$(BIN)/python -m replaylib.campaign params/campaign-$(CAMPAIGN).yaml $(ARGS)

# the tests run in TEST_WORKERS processes (pytest-xdist), each test file wholly in one (its module fixtures
# built once); TEST_WORKERS=0 runs them in this one
test: setup browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# the report site's browser test (tests/test_site.py) needs Chromium; installed here when run as root with
# apt-get (CI), else the test skips and says why
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; } || \
	  echo "chromium is not installed and cannot be installed here: the browser test will skip"

# CONFIG, STAGE and SET reach the runner through the environment, never through the shell's parsing: a value
# may hold spaces, quotes or ';'
stage: export REPLAYLIB_CONFIG := $(CONFIG)
stage: export REPLAYLIB_STAGE := $(STAGE)
stage: export REPLAYLIB_SET := $(SET)
stage: setup
	$(BIN)/python -m replaylib.models fetch --if-used "params/$$REPLAYLIB_CONFIG.yaml"
	set -f; $(BIN)/python -m replaylib.run "params/$$REPLAYLIB_CONFIG.yaml" $$REPLAYLIB_STAGE --sets "$$REPLAYLIB_SET" $(ARGS)

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_FLAGS) -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

model: setup
	$(BIN)/python -m replaylib.models fetch $(MODEL)

notebooks: setup
	$(BIN)/python tools/make_notebooks.py

# the README's tables from the generated files (the paper's from the published records)
readme: paper
	$(BIN)/python tools/readme_tables.py

lab: setup
	$(BIN)/python -m pip install -q jupyterlab==4.6.6 ipywidgets==8.1.9
	$(BIN)/jupyter lab notebooks/

verify: setup
	$(BIN)/python -m replaylib.report --verify runs/$(CONFIG)

clean:
	rm -rf runs figures/*/ tables site
