package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The Kubernetes manifests, parsed strictly as the API server would.

// object is one parsed manifest.
type object struct {
	file       string
	apiVersion string
	kind       string
	name       string
	namespace  string
	typed      any            // the k8s.io/api type, for built-in kinds
	raw        map[string]any // every kind
}

// kinds maps the built-in kinds the manifests use to their API version and
// Go type. Custom resources (ServiceMonitor, PrometheusRule) and the
// Kustomization are checked as unstructured objects.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Namespace":           {"v1", func() any { return &corev1.Namespace{} }},
	"ConfigMap":           {"v1", func() any { return &corev1.ConfigMap{} }},
	"ServiceAccount":      {"v1", func() any { return &corev1.ServiceAccount{} }},
	"Secret":              {"v1", func() any { return &corev1.Secret{} }},
	"Service":             {"v1", func() any { return &corev1.Service{} }},
	"Deployment":          {"apps/v1", func() any { return &appsv1.Deployment{} }},
	"PodDisruptionBudget": {"policy/v1", func() any { return &policyv1.PodDisruptionBudget{} }},
	"NetworkPolicy":       {"networking.k8s.io/v1", func() any { return &networkingv1.NetworkPolicy{} }},
}

var customKinds = map[string]string{
	"ServiceMonitor": "monitoring.coreos.com/v1",
	"PrometheusRule": "monitoring.coreos.com/v1",
	"Kustomization":  "kustomize.config.k8s.io/v1beta1",
}

var (
	manifestsOnce sync.Once
	manifests     []object
	manifestsErr  error
)

// loadManifests parses every document of deploy/kubernetes strictly: an
// unknown or misspelt field, a wrong type or a duplicate key is an error.
func loadManifests(t *testing.T) []object {
	t.Helper()
	manifestsOnce.Do(func() { manifests, manifestsErr = parseManifests("kubernetes") })
	if manifestsErr != nil {
		t.Fatal(manifestsErr)
	}
	return manifests
}

func parseManifests(dir string) ([]object, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no manifests in %s (%v)", dir, err)
	}
	var objs []object
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		// apimachinery's reader splits documents as kubectl does.
		docs := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 0; ; i++ {
			next, err := docs.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: reading document %d: %w", file, i+1, err)
			}
			doc := string(next)
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			where := fmt.Sprintf("%s (document %d)", file, i+1)
			var raw map[string]any
			if err := yaml.UnmarshalStrict([]byte(doc), &raw); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			o := object{file: filepath.Base(file), raw: raw}
			o.apiVersion, _ = raw["apiVersion"].(string)
			o.kind, _ = raw["kind"].(string)
			if md, ok := raw["metadata"].(map[string]any); ok {
				o.name, _ = md["name"].(string)
				o.namespace, _ = md["namespace"].(string)
			}
			if k, ok := kinds[o.kind]; ok {
				if o.apiVersion != k.apiVersion {
					return nil, fmt.Errorf("%s: %s has apiVersion %q, want %q", where, o.kind, o.apiVersion, k.apiVersion)
				}
				o.typed = k.new()
				if err := yaml.UnmarshalStrict([]byte(doc), o.typed); err != nil {
					return nil, fmt.Errorf("%s: not a valid %s: %w", where, o.kind, err)
				}
			} else if want, ok := customKinds[o.kind]; ok {
				if o.apiVersion != want {
					return nil, fmt.Errorf("%s: %s has apiVersion %q, want %q", where, o.kind, o.apiVersion, want)
				}
			} else {
				return nil, fmt.Errorf("%s: unexpected kind %q (apiVersion %q)", where, o.kind, o.apiVersion)
			}
			if o.name == "" && o.kind != "Kustomization" {
				return nil, fmt.Errorf("%s: %s without metadata.name", where, o.kind)
			}
			objs = append(objs, o)
		}
	}
	return objs, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// find returns the object of kind named name (or the only one of kind,
// when name is ""), typed as T.
func find[T any](t *testing.T, objs []object, kind, name string) T {
	t.Helper()
	var found []object
	for _, o := range objs {
		if o.kind == kind && (name == "" || o.name == name) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one %s %q in deploy/kubernetes, found %d", kind, name, len(found))
	}
	if found[0].typed != nil {
		return found[0].typed.(T)
	}
	return any(found[0].raw).(T)
}

func TestManifestsParse(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	got := map[string]int{}
	for _, o := range objs {
		got[o.kind]++
		if o.kind != "Namespace" && o.kind != "Kustomization" && o.namespace != "shepherd" {
			t.Errorf("%s: %s %s is in namespace %q, want shepherd", o.file, o.kind, o.name, o.namespace)
		}
	}
	for kind, n := range map[string]int{
		"Deployment": 1, "Service": 2, "PodDisruptionBudget": 1, "ServiceMonitor": 1, "PrometheusRule": 1,
		"Secret": 4, "ConfigMap": 1, "ServiceAccount": 1, "Namespace": 1, "Kustomization": 1, "NetworkPolicy": 1,
	} {
		if got[kind] != n {
			t.Errorf("want %d %s, found %d", n, kind, got[kind])
		}
	}
}

// A misspelt field must fail the strict parse, or the test above proves
// nothing.
func TestManifestParseIsStrict(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n"
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := parseManifests(dir); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("a Deployment with spec.replica parsed (err %v)", err)
	}
}

func TestDeployment(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	d := find[*appsv1.Deployment](t, objs, "Deployment", "")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", d.Spec.Replicas)
	}
	podLabels := d.Spec.Template.Labels
	for k, v := range d.Spec.Selector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template's labels %v", k, v, podLabels)
		}
	}
	pod := d.Spec.Template.Spec
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("pod securityContext must set runAsNonRoot")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatalf("container has no securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("container must have a read-only root filesystem")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("container must not allow privilege escalation")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
		t.Errorf("container must drop all capabilities")
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	probe := func(what string, p *corev1.Probe, path string) {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s probe: want an HTTP GET of %s", what, path)
		case p.HTTPGet.Path != path:
			t.Errorf("%s probe path %q, want %q", what, p.HTTPGet.Path, path)
		case p.HTTPGet.Port.StrVal != "" && ports[p.HTTPGet.Port.StrVal] == 0:
			t.Errorf("%s probe names port %q, which the container does not declare", what, p.HTTPGet.Port.StrVal)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")

	var dsn *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "SHEPHERD_BMDB_DSN" {
			dsn = &c.Env[i]
		}
	}
	if dsn == nil || dsn.ValueFrom == nil || dsn.ValueFrom.SecretKeyRef == nil {
		t.Fatalf("SHEPHERD_BMDB_DSN must come from a Secret")
	}
	secret := find[*corev1.Secret](t, objs, "Secret", "shepherd-bmdb")
	if ref := dsn.ValueFrom.SecretKeyRef; ref.Name != secret.Name {
		t.Errorf("DSN from Secret %q, but the example Secret is %q", ref.Name, secret.Name)
	} else if _, ok := secret.StringData[ref.Key]; !ok {
		t.Errorf("DSN from key %q, which the example Secret does not have", ref.Key)
	}

	// The daemon listens where the probes and the Service look.
	listen := flagValue(c.Args, "listen")
	if _, port, ok := strings.Cut(listen, ":"); !ok || port != strconv.Itoa(int(ports["http"])) {
		t.Errorf("-listen=%q does not serve the http port %d", listen, ports["http"])
	}
	if strings.HasPrefix(listen, "127.") || strings.HasPrefix(listen, "localhost") {
		t.Errorf("-listen=%q is unreachable from the kubelet and Prometheus", listen)
	}
	// The kubelet must wait for the daemon's graceful shutdown, which
	// gives in-flight work its grace within the bound of the whole stop.
	grace, err := time.ParseDuration(flagValue(c.Args, "shutdown_grace"))
	if err != nil {
		t.Fatalf("-shutdown_grace: %v", err)
	}
	stop, err := time.ParseDuration(flagValue(c.Args, "graceful_shutdown_timeout"))
	if err != nil {
		t.Fatalf("-graceful_shutdown_timeout: %v", err)
	}
	if stop < grace+10*time.Second {
		t.Errorf("-graceful_shutdown_timeout %s leaves no room after -shutdown_grace %s", stop, grace)
	}
	if tg := pod.TerminationGracePeriodSeconds; tg == nil || time.Duration(*tg)*time.Second <= stop {
		t.Errorf("terminationGracePeriodSeconds %v does not outlast -graceful_shutdown_timeout %s", tg, stop)
	}
}

// flagValue returns the value of -name=value in args.
func flagValue(args []string, name string) string {
	for _, a := range args {
		a = strings.TrimLeft(a, "-")
		if k, v, ok := strings.Cut(a, "="); ok && k == name {
			return v
		}
	}
	return ""
}

func TestServicePDBAndServiceMonitorSelectThePods(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	d := find[*appsv1.Deployment](t, objs, "Deployment", "")
	podLabels := d.Spec.Template.Labels
	matches := func(sel map[string]string) bool {
		for k, v := range sel {
			if podLabels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}

	svc := find[*corev1.Service](t, objs, "Service", "shepherd")
	if !matches(svc.Spec.Selector) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	containerPorts := map[string]bool{}
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		containerPorts[p.Name] = true
	}
	svcPorts := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = true
		if p.TargetPort.StrVal != "" && !containerPorts[p.TargetPort.StrVal] {
			t.Errorf("Service port %s targets %q, which the pods do not declare", p.Name, p.TargetPort.StrVal)
		}
	}

	pdb := find[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", "")
	if pdb.Spec.Selector == nil || !matches(pdb.Spec.Selector.MatchLabels) {
		t.Errorf("PodDisruptionBudget does not select the pods")
	}
	if pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
		t.Errorf("PodDisruptionBudget sets neither minAvailable nor maxUnavailable")
	}
	if pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
		t.Errorf("PodDisruptionBudget minAvailable %s would block every drain", pdb.Spec.MinAvailable.String())
	}

	sm := find[map[string]any](t, objs, "ServiceMonitor", "")
	spec, _ := sm["spec"].(map[string]any)
	selector, _ := spec["selector"].(map[string]any)
	matchLabels, _ := selector["matchLabels"].(map[string]any)
	if len(matchLabels) == 0 {
		t.Fatalf("ServiceMonitor has no spec.selector.matchLabels")
	}
	// It selects the metrics Service, and only it.
	for _, o := range objs {
		if o.kind != "Service" {
			continue
		}
		s := o.typed.(*corev1.Service)
		selected := true
		for k, v := range matchLabels {
			selected = selected && s.Labels[k] == v
		}
		if selected != (s.Name == svc.Name) {
			t.Errorf("ServiceMonitor selector %v: selects Service %s is %v", matchLabels, s.Name, selected)
		}
	}
	endpoints, _ := spec["endpoints"].([]any)
	if len(endpoints) == 0 {
		t.Fatalf("ServiceMonitor has no endpoints")
	}
	for _, e := range endpoints {
		ep, _ := e.(map[string]any)
		if port, _ := ep["port"].(string); !svcPorts[port] {
			t.Errorf("ServiceMonitor endpoint port %q is not a port of the Service", port)
		}
		if path, _ := ep["path"].(string); path != "/metrics" {
			t.Errorf("ServiceMonitor endpoint path %q, want /metrics", path)
		}
	}
}

// The kustomization applies every manifest but the example Secret.
func TestKustomizationListsTheManifests(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	k := find[map[string]any](t, objs, "Kustomization", "")
	var resources []string
	for _, r := range k["resources"].([]any) {
		resources = append(resources, r.(string))
	}
	for _, o := range objs {
		want := o.kind != "Kustomization" && o.kind != "Secret"
		if got := slices.Contains(resources, o.file); got != want {
			t.Errorf("kustomization resources %v: listing %s is %v, want %v", resources, o.file, got, want)
		}
	}
	for _, r := range resources {
		if _, err := os.Stat(filepath.Join("kubernetes", r)); err != nil {
			t.Errorf("kustomization lists %s: %v", r, err)
		}
	}
}
