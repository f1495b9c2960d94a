package deploy_test

import (
	"debug/elf"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	var user string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "FROM" {
			froms = append(froms, f[1])
		}
		if len(f) >= 2 && f[0] == "USER" {
			user = f[1]
		}
	}
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, found FROM %v", froms)
	}
	final := froms[len(froms)-1]
	if final != "scratch" && !strings.Contains(final, "distroless/static") {
		t.Errorf("final stage %q: want scratch or distroless/static for a static binary", final)
	}
	if user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
		t.Errorf("USER %q: the image must run as non-root", user)
	}
	if !strings.Contains(string(data), "CGO_ENABLED=0") {
		t.Errorf("the build must set CGO_ENABLED=0")
	}

	// The builder's Go is go.mod's.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatalf("no go directive in go.mod")
	}
	if want := "golang:" + string(m[1]); !strings.HasPrefix(froms[0], want) {
		t.Errorf("builder %q: want %s, the go version of go.mod", froms[0], want)
	}

	// The Dockerfile's build gives a binary with no dynamic loader, which
	// is what lets it run on distroless/static.
	f, err := elf.Open(shepherdBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the CGO_ENABLED=0 build is dynamically linked (program header %v)", p.Type)
		}
	}
	if _, err := f.DynamicSymbols(); err == nil || !errors.Is(err, elf.ErrNoSymbols) {
		t.Errorf("the static build has dynamic symbols (%v)", err)
	}
}

// Every file the Deployment's flags name is where the flag says: a key of a
// mounted ConfigMap or (example) Secret, or a file the Dockerfile puts in
// the image. A wrong path is a crash loop at the first rollout.
func TestDeploymentFilesExist(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	d := find[*appsv1.Deployment](t, objs, "Deployment", "")
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	keysOf := func(v corev1.Volume) (map[string]bool, string) {
		keys := map[string]bool{}
		switch {
		case v.ConfigMap != nil:
			for k := range find[*corev1.ConfigMap](t, objs, "ConfigMap", v.ConfigMap.Name).Data {
				keys[k] = true
			}
			return keys, "ConfigMap " + v.ConfigMap.Name
		case v.Secret != nil:
			for k := range find[*corev1.Secret](t, objs, "Secret", v.Secret.SecretName).StringData {
				keys[k] = true
			}
			return keys, "Secret " + v.Secret.SecretName
		}
		return nil, ""
	}
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("volumeMount %s has no volume", m.Name)
		}
	}
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, a := range c.Args {
		name, path, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok || !strings.HasPrefix(path, "/") {
			continue
		}
		checked++
		// The longest mount that contains the path.
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if strings.HasPrefix(path, m.MountPath+"/") && (mount == nil || len(m.MountPath) > len(mount.MountPath)) {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			if !regexp.MustCompile(`(?m)^COPY .* ` + regexp.QuoteMeta(path) + `$`).Match(dockerfile) {
				t.Errorf("-%s=%s is neither mounted nor copied into the image by the Dockerfile", name, path)
			}
			continue
		}
		keys, what := keysOf(volumes[mount.Name])
		if key := strings.TrimPrefix(path, mount.MountPath+"/"); !keys[key] {
			t.Errorf("-%s=%s: %s mounted at %s has no key %q (has %v)", name, path, what, mount.MountPath, key, keys)
		}
	}
	if checked < 5 {
		t.Errorf("checked %d file flags; the static provider needs at least the inventory, SSH key, agent binary and TLS pair", checked)
	}
}
