package deploy_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/shepherd-fleet/shepherd/internal/proctest"
)

// The Prometheus rules: promtool accepts them, every alert has a unit test,
// and the prometheus-operator PrometheusRule carries the same groups.

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	promtoolSucceeds(t, "check", "rules", "shepherd-rules.yml")
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	promtoolSucceeds(t, "test", "rules", "shepherd-rules_test.yml")
}

// promtoolSucceeds runs promtool with args (a command, then a file) in the
// prometheus directory and requires it to report SUCCESS.
func promtoolSucceeds(t *testing.T, args ...string) {
	t.Helper()
	promtool := proctest.Need(t, "promtool", "prometheus")
	out := run(t, "prometheus", promtool, args...)
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool %s did not report success:\n%s", strings.Join(args[:len(args)-1], " "), out)
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
	decodeYAMLFile(t, path, v, yaml.Unmarshal)
}

// readYAML reads path into v, refusing a field v does not have.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	decodeYAMLFile(t, path, v, yaml.UnmarshalStrict)
}

func decodeYAMLFile(t *testing.T, path string, v any, unmarshal func([]byte, any, ...yaml.JSONOpt) error) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
