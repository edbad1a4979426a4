package webhook

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/metrics"
)

// Serve is the envelope every kvnet admission handler runs in: a logger
// carrying the webhook's name next to the request's identity (namespace,
// name, requestID: the Edge adds those) in the
// context, a panic turned into a 500 that points at the logs instead of a
// crashed request, and the request metrics. handle sees the enriched context.
func Serve(ctx context.Context, webhook string, req admission.Request, handle func(context.Context, admission.Request) admission.Response) (resp admission.Response) {
	start := time.Now()
	// The Edge's logger in ctx carries the object's namespace and name,
	// the resource, the user and the uid (requestID), encoded only for
	// lines actually written.
	ctx, log := withWebhook(ctx, webhook)
	defer func() {
		if p := recover(); p != nil {
			log.Error(fmt.Errorf("%v", p), "handler panicked", "stack", string(debug.Stack()))
			resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("kvnet %s failed unexpectedly; see the kvnet logs for uid %s", webhook, req.UID))
		}
		observe(webhook, start, resp)
	}()
	return handle(ctx, req)
}

// observe counts the outcome of one request.
func observe(webhook string, start time.Time, resp admission.Response) {
	outcome := "allowed"
	switch {
	case resp.Result != nil && resp.Result.Code >= 500:
		outcome = "error"
	case !resp.Allowed && resp.Result != nil && resp.Result.Code == http.StatusBadRequest:
		outcome = "bad-request"
	case !resp.Allowed:
		outcome = "denied"
	case len(resp.Patches) > 0:
		outcome = "patched"
	}
	metrics.ObserveRequest(webhook, outcome, start)
}
