// Package browsertest drives the status page in a real, headless Chromium
// (TestInChromium). It is a module of its own, like cmd/shepherd-bench and
// deploy, so that the browser driver (chromedp) stays out of the module
// graph, and the go.sum, of every program that imports Shepherd. Its
// fleet comes from statuspage/statuspagetest, as the page's own tests'.
package browsertest
