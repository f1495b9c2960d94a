package scrape

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The families of a real registry's exposition, looked up by label.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_total", Help: "h"}, []string{"process", "result"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_gauge", Help: "h"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t_seconds", Help: "h"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("a", "ok").Add(2)
	c.WithLabelValues("a", "failed").Add(3)
	c.WithLabelValues("b", "ok").Add(5)
	g.Set(7)
	h.Observe(1)
	h.Observe(2)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	fams, body, err := Metrics(srv.URL, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		t.Error("empty body")
	}
	for _, tc := range []struct {
		name   string
		labels []string
		value  float64
		sum    float64
	}{
		{"t_total", []string{"process", "b"}, 5, 5},
		{"t_total", []string{"process", "a", "result", "failed"}, 3, 3},
		{"t_total", []string{"process", "a"}, 3, 5}, // Value: the first series (sorted by label)
		{"t_total", nil, 3, 10},
		{"t_gauge", nil, 7, 7},
		{"t_total", []string{"process", "c"}, -1, 0},
	} {
		if got := fams.Value(tc.name, tc.labels...); got != tc.value {
			t.Errorf("Value(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.value)
		}
		if got, err := fams.Sum(tc.name, tc.labels...); err != nil || got != tc.sum {
			t.Errorf("Sum(%s, %v) = %v, %v; want %v", tc.name, tc.labels, got, err, tc.sum)
		}
	}
	if got := fams.Value("t_seconds"); got != 2 {
		t.Errorf("Value of a histogram = %v, want its sample count 2", got)
	}
	if _, err := fams.Sum("missing"); err == nil {
		t.Error("Sum of a missing family: no error")
	}
	if got := fams.Value("missing"); got != -1 {
		t.Errorf("Value of a missing family = %v, want -1", got)
	}
}

// A status other than 200, or no server, is an error.
func TestMetricsFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	if _, _, err := Metrics(srv.URL, time.Second); err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Errorf("Metrics of a 503: %v, want an error naming status 503", err)
	}
	srv.Close()
	if _, _, err := Metrics(srv.URL, time.Second); err == nil {
		t.Error("Metrics of a closed server: no error")
	}
}
