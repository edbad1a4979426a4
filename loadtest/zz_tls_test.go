package loadtest

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func BenchmarkZZTLS(b *testing.B) {
	f, bodies := fixture(b)
	var body Body
	for _, x := range bodies {
		if x.Name == "vm" {
			body = x
		}
	}
	for _, target := range []struct {
		name string
		h    http.Handler
	}{{"floor", FloorMux()}, {"kvnet", f.KvnetMux()}} {
		b.Run(target.name, func(b *testing.B) {
			srv := httptest.NewUnstartedServer(target.h)
			srv.EnableHTTP2 = false
			srv.StartTLS()
			defer srv.Close()
			hc := srv.Client()
			hc.Transport.(*http.Transport).TLSClientConfig.NextProtos = []string{"http/1.1"}
			_ = tls.VersionTLS12
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", srv.URL+body.Path, bytes.NewReader(body.Review))
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
