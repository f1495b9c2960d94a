# The README's two commands. Each first installs the Debian packages it
# needs and the machine lacks (scripts/install-deps, with sudo when not root).
#
#   make demo   builds bin/shepherd and runs the demo with it: private
#               PostgreSQL, simulated fleet, both loops; the README's
#               operator commands run the same binary (bin/shepherd ...)
#   make test   every test, against real PostgreSQL, sshd, Prometheus,
#               Chromium, Patroni and PgBouncer: the suites of TEST_MODULES,
#               every one even when an earlier one fails, then a list of the
#               failures (scripts/test-modules)

GO ?= go

# The modules whose suites make test runs, DIR:TIMEOUT: the root module,
# then the modules of their own (examples/firmwarecheck,
# examples/httpinventory, cmd/shepherd-bench, deploy,
# statuspage/browsertest), which keep the benchmark's plotter, Kubernetes'
# types and the browser driver out of the module graph of a program that
# imports Shepherd. Override it to run some: make test TEST_MODULES=deploy
TEST_MODULES ?= .:20m \
	examples/firmwarecheck:10m \
	examples/httpinventory:10m \
	cmd/shepherd-bench:10m \
	deploy:10m \
	statuspage/browsertest:10m

.PHONY: demo test

demo:
	scripts/install-deps demo
	$(GO) build -o bin/shepherd ./cmd/shepherd
	bin/shepherd $(ARGS)

test:
	scripts/install-deps test
	GO="$(GO)" scripts/test-modules $(TEST_MODULES)
