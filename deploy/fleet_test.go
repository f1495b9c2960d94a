package deploy_test

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/providers/static"
)

// What the deployment gives the fleet: an inventory the static provider
// loads, and a heartbeat endpoint agents reach.

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
