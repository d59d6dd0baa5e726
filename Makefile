# Brainstorm: `make run` starts the gateway embedded; `make test` runs every test.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/brainstorm-target
# mold links much faster than the default linker; used when installed.
ifneq ($(shell command -v mold 2>/dev/null),)
export RUSTFLAGS ?= -C link-arg=-fuse-ld=mold
endif
LISTEN ?= 127.0.0.1:8080
DATA_DIR ?= brainstorm-data

.PHONY: help run build release test bench lint fmt gen

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

run: ## start every service in one process (SQLite in ./brainstorm-data) on $(LISTEN)
	cargo run -p brainstorm -- up --listen $(LISTEN) --data-dir $(DATA_DIR)

build: ## build the brainstorm binary
	cargo build -p brainstorm

release: ## build the optimised binary (profile-guided: trains on the benchmark's load; prints its path)
	scripts/release-pgo.sh

test: ## run every test (starts PostgreSQL when none answers)
	scripts/test.sh

bench: ## measure added latency, throughput, CPU per request and memory against a mock upstream (report in target/bench/latest.json; options in BENCH_ARGS)
	bench/run.sh $(BENCH_ARGS)

lint: ## formatting and clippy with warnings as errors
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

gen: ## regenerate the CustomResourceDefinitions (manifests/crds.yaml and the chart's crds/) from the operator's types, and the OpenAPI document from the edge's routes
	python3 scripts/gen-openapi.py
	cargo run -q -p brainstorm -- crd > manifests/crds.yaml
	mkdir -p charts/brainstorm/crds
	cp manifests/crds.yaml charts/brainstorm/crds/brainstorm-crds.yaml

fmt: ## format the code
	cargo fmt --all
