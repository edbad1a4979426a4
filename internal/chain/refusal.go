package chain

import (
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Refusal is the one error the webhooks answer with a 4xx: kvnet refuses the
// object because of what the user wrote (or asked for and cannot have). Any
// other error is kvnet failing to do its own work and becomes a 500, even
// when it wraps an API status: a 403, 404 or 429 from kvnet's own reads and
// writes is not the user's mistake and must not read as one.
type Refusal struct {
	err *apierrors.StatusError
}

// Refuse marks status as the user's to fix.
func Refuse(status *apierrors.StatusError) error { return &Refusal{err: status} }

// RefuseInvalid is the 422 with one cause per field, as virt-api gives it.
func RefuseInvalid(gk schema.GroupKind, name string, errs field.ErrorList) error {
	return Refuse(apierrors.NewInvalid(gk, name, errs))
}

// RefuseForbidden is a 403 for a request kvnet cannot grant, such as an
// address from an exhausted pool.
func RefuseForbidden(msg string) error {
	return Refuse(&apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: msg,
	}})
}

func (r *Refusal) Error() string { return r.err.Error() }

// Unwrap lets apierrors.IsInvalid and friends see the status.
func (r *Refusal) Unwrap() error { return r.err }

// Status is what the user gets.
func (r *Refusal) Status() metav1.Status { return r.err.Status() }
