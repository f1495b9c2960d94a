// Package scripts holds the shell scripts that set up a machine for
// Shepherd (install-deps, called by the Makefile and .ci/run) and the tests
// that run them as on a fresh machine.
package scripts
