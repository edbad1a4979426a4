package migration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/webhook"
)

// sidecarSection turns sidecar mode on, as the chart renders it (shortened).
const sidecarSection = `
  proxySidecar:
    enabled: true
    container:
      name: kvnet-proxy
      image: ghcr.io/kvnet/kvnet:test
      args: [proxy, --advertise-interface=migration0, --hop-interface=crosscluster0]
      volumeMounts: [{name: kvnet-proxy-cert, mountPath: /etc/kvnet/proxy, readOnly: true}]
    volumes: [{name: kvnet-proxy-cert, secret: {secretName: proxy-cert}}]
`

// syncPodJSON is a synchronization-controller pod as the API server sends it to
// the webhook: virt-operator's containers, and the token mount the
// ServiceAccount admission added before the webhooks run.
const syncPodJSON = `{"metadata":{"generateName":"virt-synchronization-controller-7d-","labels":{"kubevirt.io":"virt-synchronization-controller"},
"annotations":{"k8s.v1.cni.cncf.io/networks":"migration@migration0"}},
"spec":{"serviceAccountName":"kubevirt-synchronization-controller","containers":[{"name":"sync","image":"quay.io/kubevirt/virt-synchronization-controller:v1.9.0",
"volumeMounts":[{"name":"profile-data","mountPath":"/profile-data"},{"name":"kube-api-access-x1","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}]}],
"volumes":[{"name":"profile-data","emptyDir":{}},{"name":"kube-api-access-x1","projected":{"sources":[{"serviceAccountToken":{"path":"token"}}]}}]}}`

func sidecarHandler(t *testing.T, cfgYAML string) func(raw []byte, op admissionv1.Operation) ([]byte, int32) {
	cfg := config.Static(mustConfig(t, cfgYAML))
	h := webhook.NewHandlers(cfg, facts(), webhook.Chains{
		MigrationPod: []chain.PodMutator{newMutator(newFake(t)), Sidecar{}},
	})[webhook.PathMutateMigrationPods]
	return func(raw []byte, op admissionv1.Operation) ([]byte, int32) {
		req := migrationPodReview(raw)
		req.Operation = op
		if op == admissionv1.Update {
			req.OldObject.Raw = raw
		}
		resp := h.Handle(context.Background(), req)
		if !resp.Allowed {
			return nil, resp.Result.Code
		}
		if len(resp.Patches) == 0 {
			return raw, http.StatusOK
		}
		return applyPatch(t, raw, resp), http.StatusOK
	}
}

func decodePod(t *testing.T, raw []byte) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func TestSidecarInjectedOnceWithItsVolumesAndToken(t *testing.T) {
	admit := sidecarHandler(t, bothNetworks+sidecarSection)
	out, code := admit([]byte(syncPodJSON), admissionv1.Create)
	if code != http.StatusOK {
		t.Fatalf("refused: %d", code)
	}
	pod := decodePod(t, out)
	if len(pod.Spec.Containers) != 2 || pod.Spec.Containers[0].Name != "sync" || pod.Spec.Containers[1].Name != "kvnet-proxy" {
		t.Fatalf("containers %+v", pod.Spec.Containers)
	}
	// virt-operator's container is untouched, unknown fields and all.
	if pod.Spec.Containers[0].Image != "quay.io/kubevirt/virt-synchronization-controller:v1.9.0" || len(pod.Spec.Containers[0].VolumeMounts) != 2 {
		t.Fatalf("the sync container changed: %+v", pod.Spec.Containers[0])
	}
	proxy := pod.Spec.Containers[1]
	if proxy.Image != "ghcr.io/kvnet/kvnet:test" || len(proxy.Args) != 3 {
		t.Fatalf("sidecar %+v", proxy)
	}
	mounts := map[string]string{}
	for _, m := range proxy.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if mounts["/etc/kvnet/proxy"] != "kvnet-proxy-cert" || mounts[TokenMountPath] != "kube-api-access-x1" {
		t.Fatalf("sidecar mounts %v: want its certificate and the pod's token", mounts)
	}
	if len(pod.Spec.Volumes) != 3 || pod.Spec.Volumes[2].Secret == nil || pod.Spec.Volumes[2].Secret.SecretName != "proxy-cert" {
		t.Fatalf("volumes %+v", pod.Spec.Volumes)
	}
	// The pod gets both addresses: crosscluster0 for the hop and
	// migration0 for the relays, without alsoInCluster.
	if n := len(PodAddresses(pod)); n != 2 {
		t.Fatalf("pod has %d migration addresses, want 2: %s", n, pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	}

	// Reinvoked (or a second replica): nothing more.
	again, _ := admit(out, admissionv1.Create)
	if string(again) != string(out) {
		t.Fatalf("second run changed the pod:\n%s\n%s", out, again)
	}
	// An UPDATE of the injected pod, and of a pod without the sidecar:
	// never a container added or taken away.
	for _, raw := range [][]byte{out, []byte(syncPodJSON)} {
		upd, code := admit(raw, admissionv1.Update)
		if code != http.StatusOK || string(upd) != string(raw) {
			t.Fatalf("UPDATE changed the pod (%d):\n%s", code, upd)
		}
	}
}

func TestSidecarOnlyWhereConfigured(t *testing.T) {
	handler := []byte(`{"metadata":{"labels":{"kubevirt.io":"virt-handler"}},"spec":{"nodeName":"n1","containers":[{"name":"virt-handler"}]}}`)
	for name, tc := range map[string]struct {
		cfg  string
		pod  []byte
		want int // containers after admission
	}{
		"on":                          {cfg: bothNetworks + sidecarSection, pod: []byte(syncPodJSON), want: 2},
		"off switch":                  {cfg: bothNetworks + "  proxySidecar: {enabled: false, container: {name: kvnet-proxy, image: x}}\n", pod: []byte(syncPodJSON), want: 1},
		"no section":                  {cfg: bothNetworks, pod: []byte(syncPodJSON), want: 1},
		"virt-handler never gets one": {cfg: bothNetworks + sidecarSection, pod: handler, want: 1},
		"look-alike never gets one": {cfg: bothNetworks + sidecarSection, want: 1,
			pod: []byte(strings.Replace(syncPodJSON, `"serviceAccountName":"kubevirt-synchronization-controller"`, `"serviceAccountName":"default"`, 1))},
	} {
		t.Run(name, func(t *testing.T) {
			out, code := sidecarHandler(t, tc.cfg)(tc.pod, admissionv1.Create)
			if code != http.StatusOK {
				t.Fatalf("refused: %d", code)
			}
			if got := len(decodePod(t, out).Spec.Containers); got != tc.want {
				t.Fatalf("%d containers, want %d", got, tc.want)
			}
		})
	}
}

// A pod that already has a volume of the sidecar's name is refused (403)
// rather than given a sidecar that mounts someone else's volume.
func TestSidecarVolumeClashRefused(t *testing.T) {
	pod := `{"metadata":{"labels":{"kubevirt.io":"virt-synchronization-controller"}},"spec":{"serviceAccountName":"kubevirt-synchronization-controller","containers":[{"name":"sync"}],"volumes":[{"name":"kvnet-proxy-cert","emptyDir":{}}]}}`
	if _, code := sidecarHandler(t, bothNetworks+sidecarSection)([]byte(pod), admissionv1.Create); code != http.StatusForbidden {
		t.Fatalf("code %d, want 403", code)
	}
}
