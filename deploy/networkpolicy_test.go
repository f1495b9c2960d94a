package deploy_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The NetworkPolicy selects Shepherd's pods, opens the HTTP port (metrics,
// status page) only to the monitoring and shepherd namespaces, and the
// agents' port to the machines; the agents' Service keeps the machines'
// source addresses.
func TestNetworkPolicyAndAgentService(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)
	np := find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "shepherd")
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "shepherd" {
		t.Errorf("the NetworkPolicy selects %v, not Shepherd's pods", np.Spec.PodSelector.MatchLabels)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Error("the NetworkPolicy does not restrict ingress")
	}
	httpFrom := map[string]bool{}
	var agentsOpen bool
	for _, rule := range np.Spec.Ingress {
		for _, port := range rule.Ports {
			switch *port.Port {
			case intstr.FromString("http"):
				for _, peer := range rule.From {
					if peer.NamespaceSelector == nil || peer.IPBlock != nil {
						t.Errorf("the HTTP port is open to a peer other than a namespace: %+v", peer)
						continue
					}
					httpFrom[peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]] = true
				}
			case intstr.FromString("agents"):
				agentsOpen = true
			default:
				t.Errorf("the NetworkPolicy opens port %v, which the pods do not name", port.Port)
			}
		}
	}
	if !httpFrom["monitoring"] || !httpFrom["shepherd"] || len(httpFrom) != 2 {
		t.Errorf("the HTTP port is open to namespaces %v, want monitoring and shepherd", httpFrom)
	}
	if !agentsOpen {
		t.Error("the agents' port is not open: heartbeats would be refused")
	}
	svc := find[*corev1.Service](t, objs, "Service", "shepherd-agents")
	if svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Errorf("shepherd-agents has externalTrafficPolicy %q, want Local (keep the machines' source addresses)", svc.Spec.ExternalTrafficPolicy)
	}
}
