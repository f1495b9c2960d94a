package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/shepherd-fleet/shepherd/internal/gobuild"
)

// The flags the manifests and the unit pass exist in the binary they run.

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
)

// shepherdBinary builds cmd/shepherd with CGO_ENABLED=0 as the Dockerfile
// does, once per test binary. It leaves out the Dockerfile's -trimpath and
// -ldflags, which do not change how the binary links but would make the
// build miss the build cache the other tests fill.
func shepherdBinary(t *testing.T) string {
	t.Helper()
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "shepherd-deploy-test-")
		if err != nil {
			binaryErr = err
			return
		}
		binaryPath, err = gobuild.Build(dir, "github.com/shepherd-fleet/shepherd/cmd/shepherd", []string{"CGO_ENABLED=0"})
		if err != nil {
			binaryErr = fmt.Errorf("building cmd/shepherd as the Dockerfile does: %w", err)
		}
	})
	if binaryErr != nil {
		t.Fatal(binaryErr)
	}
	return binaryPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaryPath != "" {
		os.RemoveAll(filepath.Dir(binaryPath))
	}
	os.Exit(code)
}

// daemonFlags lists the flags 'shepherd run' accepts, from its -h output.
func daemonFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, _ := exec.Command(shepherdBinary(t), "run", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9_]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["listen"] {
		t.Fatalf("cannot read the daemon's flags from 'shepherd run -h':\n%s", out)
	}
	return flags
}

// checkArgs fails for every -flag in args that the daemon does not know: a
// typo in a manifest is a crash loop in production.
func checkArgs(t *testing.T, where string, args []string, known map[string]bool) {
	t.Helper()
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !known[name] {
			t.Errorf("%s passes -%s, which 'shepherd run' does not know", where, name)
		}
	}
}

func TestDeployedFlagsExist(t *testing.T) {
	t.Parallel()
	known := daemonFlags(t)
	d := find[*appsv1.Deployment](t, loadManifests(t), "Deployment", "")
	args := d.Spec.Template.Spec.Containers[0].Args
	if len(args) == 0 || args[0] != "run" {
		t.Errorf("Deployment args %v: want the run subcommand first", args)
	}
	checkArgs(t, "deployment.yaml", args, known)

	unit := readUnit(t)
	exec := strings.Fields(unit["ExecStart"][0])
	if len(exec) < 2 || exec[1] != "run" {
		t.Errorf("ExecStart %v: want the run subcommand first", exec)
	}
	checkArgs(t, "shepherd.service", exec, known)
}
