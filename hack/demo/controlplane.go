package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/test/framework"
)

// startControlPlane starts kube-apiserver and etcd with the CRDs kvnet
// works with. frontProxyDir, when set, receives the request-header
// certificates kube-apiserver needs for virt-api to start. The caller stops
// it.
func startControlPlane(say sayFunc, frontProxyDir string) (*envtest.Environment, error) {
	assets, err := framework.AssetsDir()
	if err != nil {
		return nil, err
	}
	crds, err := framework.CRDPaths()
	if err != nil {
		return nil, err
	}
	say("==> starting kube-apiserver and etcd from %s", assets)
	te := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: true}
	if frontProxyDir != "" {
		if err := framework.FrontProxy(te, frontProxyDir); err != nil {
			return nil, err
		}
	}
	if _, err := te.Start(); err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	return te, nil
}

// adminClient adds a cluster admin to the control plane, writes its
// kubeconfig to dir (for kvnet, and for the user with --keep) and returns a
// client with its rights whose admission warnings land in the collector.
func adminClient(te *envtest.Environment, dir string) (client.Client, *warningCollector, string, error) {
	user, err := te.AddUser(envtest.User{Name: "demo-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, nil, "", err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, nil, "", err
	}
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return nil, nil, "", err
	}
	warnings := &warningCollector{}
	cfg := rest.CopyConfig(te.Config)
	cfg.WarningHandlerWithContext = warnings
	c, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		return nil, nil, "", err
	}
	return c, warnings, kcPath, nil
}
