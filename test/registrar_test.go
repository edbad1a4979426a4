package test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

// An admin turns persistent IPs and a migration network on and off by
// editing the config alone: the leader's Registrar adds and removes the pod
// webhooks in the real API server, which accepts what it writes, and leaves
// every other webhook as the installer rendered it.
func TestPodWebhooksFollowConfigWithoutReinstall(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	parse := func(yaml string) *config.Config {
		c, err := config.Parse([]byte(yaml), framework.KvnetNamespace)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	off := parse("persistentIPs:\n  enabled: false\nresources:\n  inject: never\n")
	on := parse("migration:\n  inCluster:\n    nad: kvnet-system/migration\n    pool:\n      cidr: 10.91.0.0/24\n")

	// Installed as the chart renders it for `off`: no pod webhooks. The
	// URL points nowhere reachable and the namespace selector matches no
	// namespace, so nothing else in the suite is sent here.
	name := fmt.Sprintf("kvnet-registrar-%d", time.Now().UnixNano())
	mwc, _ := webhook.Registration{Name: name, CABundle: []byte("not-a-real-bundle")}.For(off).Configurations()
	for i := range mwc.Webhooks {
		cc := &mwc.Webhooks[i].ClientConfig
		cc.URL, cc.Service = ptr.To("https://127.0.0.1:1"+*cc.Service.Path), nil
		mwc.Webhooks[i].NamespaceSelector.MatchLabels = map[string]string{"kvnet.io/registrar-test": name}
	}
	if err := env.Client.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mwc) })

	src := config.Static(off)
	r := &webhook.Registrar{Name: name, Reader: env.Client, Writer: env.Client, Config: src, Log: testr.New(t), Interval: 100 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	stored := func() (*admissionregv1.MutatingWebhookConfiguration, []string) {
		var got admissionregv1.MutatingWebhookConfiguration
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, w := range got.Webhooks {
			names = append(names, w.Name)
		}
		return &got, names
	}
	vmOnly := []string{"virtualmachines.mutate.kvnet.io", "virtualmachineinstances.mutate.kvnet.io"}
	withPods := append(slices.Clone(vmOnly), "launcher-pods.mutate.kvnet.io", "migration-pods.mutate.kvnet.io")

	src.Set(on)
	framework.Eventually(t, "the pod webhooks registered", 30*time.Second, func() error {
		if _, names := stored(); !slices.Equal(names, withPods) {
			return fmt.Errorf("webhooks %v", names)
		}
		return nil
	})
	got, _ := stored()
	for _, w := range got.Webhooks[2:] {
		if w.ClientConfig.URL == nil || string(w.ClientConfig.CABundle) != "not-a-real-bundle" ||
			w.NamespaceSelector.MatchLabels["kvnet.io/registrar-test"] != name {
			t.Errorf("%s: clientConfig %+v, selector %+v; want the VM webhook's URL host, bundle and selector", w.Name, w.ClientConfig, w.NamespaceSelector)
		}
	}
	if want := "https://127.0.0.1:1" + webhook.PathMutateLauncherPods; *got.Webhooks[2].ClientConfig.URL != want {
		t.Errorf("launcher-pods url %s, want %s", *got.Webhooks[2].ClientConfig.URL, want)
	}

	src.Set(off)
	framework.Eventually(t, "the pod webhooks removed", 30*time.Second, func() error {
		if _, names := stored(); !slices.Equal(names, vmOnly) {
			return fmt.Errorf("webhooks %v", names)
		}
		return nil
	})

	// A configuration edited by hand behind kvnet's back is repaired on
	// the next change of config, without restarting anything.
	got, _ = stored()
	got.Webhooks = append(got.Webhooks, admissionregv1.MutatingWebhook{})
	want, _ := webhook.Registration{Name: name}.For(on).Configurations()
	got.Webhooks[len(got.Webhooks)-1] = want.Webhooks[2]
	got.Webhooks[len(got.Webhooks)-1].ClientConfig = got.Webhooks[0].ClientConfig
	if err := env.Client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	src.Set(parse("persistentIPs:\n  enabled: false\nresources:\n  inject: never\n"))
	framework.Eventually(t, "the hand-added launcher-pods webhook removed", 30*time.Second, func() error {
		if _, names := stored(); !slices.Equal(names, vmOnly) {
			return fmt.Errorf("webhooks %v", names)
		}
		return nil
	})
}
