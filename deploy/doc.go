// Package deploy holds how operators run Shepherd, as files rather than Go:
// Kubernetes manifests (kubernetes/), Prometheus alert rules and their unit
// tests (prometheus/), a systemd unit (systemd/) and the Dockerfile. Its Go
// tests check them: the manifests parse strictly as Kubernetes objects and
// agree with each other and with the daemon's flags, promtool checks and
// tests the rules, systemd-analyze verifies the unit, and the Dockerfile's
// build gives a static binary.
package deploy
