package chart

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/test/framework"
)

// scrapers are the two ServiceAccounts a metrics test scrapes as, in
// namespace ns: one bound to the chart's <fullname>-metrics-reader
// ClusterRole, as metrics.reader.subjects binds a Prometheus, and one
// with no binding.
type scrapers struct{ reader, stranger string }

func newScrapers(t *testing.T, ns, fullname string) scrapers {
	t.Helper()
	ctx := t.Context()
	var s scrapers
	var err error
	if s.reader, err = framework.ServiceAccountToken(ctx, cl, ns, "prometheus"); err != nil {
		t.Fatal(err)
	}
	if s.stranger, err = framework.ServiceAccountToken(ctx, cl, ns, "stranger"); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-prometheus-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: fullname + "-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}},
	}
	if err := cl.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(ctx, crb) })
	return s
}

// check scrapes addr as nobody, as the stranger and as the reader, and
// over plain HTTP: only the reader, over HTTPS, gets series (want, a
// metric name). The process answers as its chart ServiceAccount, so a
// TokenReview or SubjectAccessReview the chart's RBAC does not allow shows
// up as a 500 for the reader.
func (s scrapers) check(t *testing.T, addr string, tlsConfig *tls.Config, want string) {
	t.Helper()
	code, body, err := framework.ScrapePlain(addr)
	if err != nil || code != http.StatusBadRequest || strings.Contains(body, "kvnet_") {
		t.Errorf("plain HTTP to %s: %d, %v, %.200q; want TLS's 400 and no series", addr, code, err, body)
	}
	for _, tc := range []struct {
		who   string
		token string
		want  int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a ServiceAccount without the metrics-reader role", s.stranger, http.StatusForbidden},
		{"a ServiceAccount bound to the chart's metrics-reader role", s.reader, http.StatusOK},
	} {
		code, body, err := framework.Scrape(addr, tlsConfig, tc.token)
		if err != nil {
			t.Errorf("%s: %v", tc.who, err)
			continue
		}
		if code != tc.want {
			t.Errorf("%s: %d, want %d: %.200s", tc.who, code, tc.want, body)
		}
		if got := strings.Contains(body, want); got != (tc.want == http.StatusOK) {
			t.Errorf("%s: %s in the answer = %v, want %v", tc.who, want, got, tc.want == http.StatusOK)
		}
	}
}

// waitListening polls until something accepts TCP connections on addr.
func waitListening(t *testing.T, p *process, addr string) {
	t.Helper()
	wait(t, "the metrics listener on "+addr, time.Minute, p.done, &p.err, func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// nonLoopbackAddr is one of this machine's non-loopback addresses (the
// stand-in for a pod's migration network address), or 127.0.0.1 when it
// has none.
func nonLoopbackAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Log("no non-loopback IPv4 address on this machine: scraping through 127.0.0.1")
	return "127.0.0.1"
}

// argValue is the value of --name=value in args (the last one wins, as in
// pflag), and whether it is there.
func argValue(args []string, name string) (string, bool) {
	var v string
	var ok bool
	for _, a := range args {
		if rest, found := strings.CutPrefix(a, "--"+name+"="); found {
			v, ok = rest, true
		}
	}
	return v, ok
}

// hostPort joins host and a free port.
func hostPort(t *testing.T, host string) string {
	t.Helper()
	return net.JoinHostPort(host, fmt.Sprint(framework.FreePort(t)))
}
