package loadtest

import (
	"context"
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/webhook"
)

// Floor is the do-nothing controller-runtime webhook: admission.Webhook
// decoding the review and answering "allowed" without looking at the
// object. Nothing mounted on controller-runtime's webhook server answers
// faster, so kvnet's figures are ratios to it.
func Floor() http.Handler {
	return &admission.Webhook{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})}
}

// KvnetMux serves every fixture handler at its path, as `kvnet webhook`
// mounts them.
func (f *Fixture) KvnetMux() *http.ServeMux {
	mux := http.NewServeMux()
	for path, h := range f.Handlers() {
		mux.Handle(path, webhook.Webhook(h))
	}
	return mux
}

// FloorMux serves the floor at every path kvnet serves.
func FloorMux() *http.ServeMux {
	mux := http.NewServeMux()
	floor := Floor()
	for _, path := range []string{webhook.PathMutateVM, webhook.PathMutateVMI, webhook.PathValidateVM, webhook.PathValidateVMI,
		webhook.PathMutateLauncherPods, webhook.PathMutateMigrationPods, webhook.PathMutateVMIMigrationStatus} {
		mux.Handle(path, floor)
	}
	return mux
}

// authenticationUser is who creates VMs in the fixture reviews: a user, as
// the API server names them.
func authenticationUser() authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: "alice@example.com", UID: "3c4c1f0e-8f4a-4b9e-9a0e-1d2c3b4a5f6e", Groups: []string{"tenant-a-admins", "system:authenticated"}}
}
