// Package metric declares Prometheus metrics in one call each. Every
// Shepherd metric has a full name (no namespace or subsystem), a help text
// and, for a vector, its labels, and is registered where it is made; the
// client library's option structs would only repeat that shape at each
// declaration.
package metric

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Counter makes a counter and registers it with reg (nil: not registered).
func Counter(reg prometheus.Registerer, name, help string) prometheus.Counter {
	return promauto.With(reg).NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec makes a counter with labels and registers it with reg (nil:
// not registered).
func CounterVec(reg prometheus.Registerer, name, help string, labels ...string) *prometheus.CounterVec {
	return promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Gauge makes a gauge and registers it with reg (nil: not registered).
func Gauge(reg prometheus.Registerer, name, help string) prometheus.Gauge {
	return promauto.With(reg).NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeVec makes a gauge with labels and registers it with reg (nil: not
// registered).
func GaugeVec(reg prometheus.Registerer, name, help string, labels ...string) *prometheus.GaugeVec {
	return promauto.With(reg).NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// Histogram makes a histogram with buckets and registers it with reg (nil:
// not registered).
func Histogram(reg prometheus.Registerer, name, help string, buckets []float64) prometheus.Histogram {
	return promauto.With(reg).NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// HistogramVec makes a histogram with buckets and labels and registers it
// with reg (nil: not registered).
func HistogramVec(reg prometheus.Registerer, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return promauto.With(reg).NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}
