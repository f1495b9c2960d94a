# The README's two commands. Each first installs the Debian packages it
# needs and the machine lacks (scripts/install-deps, with sudo when not root).
#
#   make demo   the demo: private PostgreSQL, simulated fleet, both loops
#   make test   every test, against real PostgreSQL, sshd, Prometheus, Chromium,
#               Patroni and PgBouncer: the root module's, then those of the
#               modules of their own (examples/firmwarecheck,
#               examples/httpinventory, cmd/shepherd-bench, deploy,
#               statuspage/browsertest), which keep the benchmark's plotter,
#               Kubernetes' types and the browser driver out of the module
#               graph of a program that imports Shepherd

GO ?= go

.PHONY: demo test

demo:
	scripts/install-deps demo
	$(GO) run ./cmd/shepherd $(ARGS)

test:
	scripts/install-deps test
	$(GO) test -count=1 -timeout 20m ./...
	cd examples/firmwarecheck && $(GO) test -count=1 -timeout 10m ./...
	cd examples/httpinventory && $(GO) test -count=1 -timeout 10m ./...
	cd cmd/shepherd-bench && $(GO) test -count=1 -timeout 10m ./...
	cd deploy && $(GO) test -count=1 -timeout 10m ./...
	cd statuspage/browsertest && $(GO) test -count=1 -timeout 10m ./...
