// Package repocheck holds checks over the repository's source that go vet
// and staticcheck do not know: rules of this project, such as which
// packages may use klog's global logger. It has tests only.
package repocheck
