package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
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
	"sigs.k8s.io/yaml"

	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
	"github.com/shepherd-fleet/shepherd/providers/static"
)

// need returns the path of a tool the test cannot do without, failing (not
// skipping: a skipped check protects nothing) with the Debian package that
// provides it.
func need(t *testing.T, tool, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err != nil {
		t.Fatalf("%s not found on PATH: install the Debian package %q (apt-get install -y %s)", tool, debianPackage, debianPackage)
	}
	return path
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	promtool := need(t, "promtool", "prometheus")
	out := run(t, "prometheus", promtool, "check", "rules", "shepherd-rules.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules did not report success:\n%s", out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	promtool := need(t, "promtool", "prometheus")
	out := run(t, "prometheus", promtool, "test", "rules", "shepherd-rules_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules did not report success:\n%s", out)
	}
}

// Every alert of the rules file has a unit test: an untested alert is one
// whose expression nobody has seen fire.
func TestEveryAlertIsTested(t *testing.T) {
	t.Parallel()
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	readPartialYAML(t, "prometheus/shepherd-rules.yml", &rules)
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	readPartialYAML(t, "prometheus/shepherd-rules_test.yml", &tests)
	firing := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !firing[r.Alert] {
				t.Errorf("alert %s has no test in which it fires", r.Alert)
			}
		}
	}
	if n < 5 {
		t.Errorf("found %d alerts, want at least the five of the design", n)
	}
}

// The PrometheusRule for prometheus-operator carries the same groups as the
// plain rules file that promtool tests.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	t.Parallel()
	var file map[string]any
	readYAML(t, "prometheus/shepherd-rules.yml", &file)
	var pr map[string]any
	readYAML(t, "kubernetes/prometheusrule.yaml", &pr)
	spec, _ := pr["spec"].(map[string]any)
	if !reflect.DeepEqual(spec, file) {
		t.Fatalf("kubernetes/prometheusrule.yaml's spec differs from prometheus/shepherd-rules.yml: copy the groups over")
	}
}

// readPartialYAML reads the fields of v from path, ignoring the others.
func readPartialYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

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
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
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
	// The kubelet must wait for the daemon's graceful shutdown.
	grace, err := time.ParseDuration(flagValue(c.Args, "shutdown_grace"))
	if err != nil {
		t.Fatalf("-shutdown_grace: %v", err)
	}
	if tg := pod.TerminationGracePeriodSeconds; tg == nil || time.Duration(*tg)*time.Second < grace+10*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v leaves no room after -shutdown_grace %s", tg, grace)
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

// readUnit parses the systemd unit into directive -> values, joining
// continuation lines.
func readUnit(t *testing.T) map[string][]string {
	t.Helper()
	data, err := os.ReadFile("systemd/shepherd.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string][]string{}
	var pending string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if pending == "" && (line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			pending += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line, pending = pending+line, ""
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("shepherd.service: cannot parse %q", line)
		}
		unit[k] = append(unit[k], v)
	}
	return unit
}

func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	unit := readUnit(t)
	for directive, want := range map[string]string{
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"CapabilityBoundingSet":   "",
		"SystemCallFilter":        "@system-service",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"User":                    "shepherd",
		"KillSignal":              "SIGTERM",
	} {
		if !slices.Contains(unit[directive], want) {
			t.Errorf("%s=%s missing (have %q)", directive, want, unit[directive])
		}
	}
	if ef := unit["EnvironmentFile"]; len(ef) != 1 || !strings.HasPrefix(ef[0], "/") {
		t.Errorf("EnvironmentFile (for SHEPHERD_BMDB_DSN) missing")
	}
	if strings.Contains(strings.Join(unit["ExecStart"], " "), "bmdb_dsn") {
		t.Errorf("ExecStart must not carry the DSN: it is visible to every user in ps")
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Logf("systemd-analyze not found (Debian package systemd): unit checked by parsing only")
		return
	}
	// verify wants the executable and the environment file to exist.
	dir := t.TempDir()
	data, _ := os.ReadFile("systemd/shepherd.service")
	test := strings.ReplaceAll(string(data), "/usr/local/bin/shepherd ", "/bin/true ")
	test = strings.ReplaceAll(test, "EnvironmentFile=/", "EnvironmentFile=-/")
	path := filepath.Join(dir, "shepherd.service")
	if err := os.WriteFile(path, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || strings.Contains(string(out), "shepherd.service") {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Exposure 0 is a perfect sandbox, 10 none at all; the unit scores
	// about 1.4. --threshold makes a worse score an error.
	out, err = exec.Command(analyze, "security", "--offline=yes", "--threshold=20", path).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze security: exposure above 2.0: %v\n%s", err, lastLines(string(out), 3))
	}
}

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

// The example inventory is one the static provider loads, with the example
// BMC credentials where the Deployment mounts them.
func TestInventoryLoads(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	cm := find[*corev1.ConfigMap](t, objs, "ConfigMap", "shepherd-inventory")
	bmc := find[*corev1.Secret](t, objs, "Secret", "shepherd-bmc")
	dir := t.TempDir()
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	for k, v := range bmc.StringData {
		if err := os.WriteFile(filepath.Join(dir, "secrets", k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := static.Load(filepath.Join(dir, "inventory.yaml"))
	if err != nil {
		t.Fatalf("the example inventory does not load: %v", err)
	}
	if len(inv.Machines) < 2 {
		t.Errorf("the example inventory has %d machines", len(inv.Machines))
	}
}

// Agents reach the heartbeat endpoint: the Service exposes the port the
// daemon listens on, at the port the URL sent to agents names.
func TestAgentEndpoint(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	d := find[*appsv1.Deployment](t, objs, "Deployment", "")
	c := d.Spec.Template.Spec.Containers[0]
	var agentPort int32
	for _, p := range c.Ports {
		if p.Name == "agents" {
			agentPort = p.ContainerPort
		}
	}
	if _, port, _ := strings.Cut(flagValue(c.Args, "agent_listen"), ":"); port != strconv.Itoa(int(agentPort)) {
		t.Errorf("-agent_listen=%s does not listen on the agents port %d", flagValue(c.Args, "agent_listen"), agentPort)
	}
	svc := find[*corev1.Service](t, objs, "Service", "shepherd-agents")
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != "agents" {
		t.Fatalf("shepherd-agents Service ports %+v: want one, targeting the agents port", svc.Spec.Ports)
	}
	u, err := url.Parse(flagValue(c.Args, "agent_heartbeat_url"))
	if err != nil || u.Scheme != "https" {
		t.Fatalf("-agent_heartbeat_url %q: want an https URL (%v)", flagValue(c.Args, "agent_heartbeat_url"), err)
	}
	if u.Port() != strconv.Itoa(int(svc.Spec.Ports[0].Port)) {
		t.Errorf("-agent_heartbeat_url port %s, but the Service listens on %d", u.Port(), svc.Spec.Ports[0].Port)
	}
	if u.Path != heartbeat.Path {
		t.Errorf("-agent_heartbeat_url path %s, want %s", u.Path, heartbeat.Path)
	}
}
