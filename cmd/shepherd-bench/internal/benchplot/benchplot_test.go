package benchplot

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func sampleChart() Chart {
	return Chart{
		Title:  "Throughput vs workers",
		XLabel: "workers (log scale)",
		YLabel: "cycles/s",
		XLog2:  true,
		Series: []Series{
			{Name: "N=10k", X: []float64{1, 4, 16, 64}, Y: []float64{300, 900, 1500, 1600}, Color: Palette[0]},
			{Name: "N=100k", X: []float64{1, 4, 16, 64}, Y: []float64{280, 850, 1400, 1550}, Color: Palette[1]},
		},
		HLines: []HLine{
			{Name: "target: 0.8 x pgbench/2", Y: 1200, Color: Palette[2], Dashed: true},
			{Name: "seeds' algorithm", Y: 60, Color: Palette[3]},
		},
	}
}

// colourBox is the bounding box of the pixels of exactly colour c, and
// their count.
func colourBox(img image.Image, c color.RGBA) (image.Rectangle, int) {
	var box image.Rectangle
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if uint8(r>>8) != c.R || uint8(g>>8) != c.G || uint8(bl>>8) != c.B {
				continue
			}
			if n == 0 {
				box = image.Rect(x, y, x+1, y+1)
			} else {
				box = box.Union(image.Rect(x, y, x+1, y+1))
			}
			n++
		}
	}
	return box, n
}

// The PNG decodes at the asked size, and every series and reference line
// is drawn in its colour, in the plot and in the legend beside it.
func TestRender(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleChart().WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 600 {
		t.Fatalf("size %v, want 1280x600", b)
	}
	// A series line spans the plot from the first to the last point; a
	// reference line spans it whole. Both also have their legend entry,
	// right of the plot.
	c := sampleChart()
	var lines []color.RGBA
	for _, s := range c.Series {
		lines = append(lines, s.Color)
	}
	for _, h := range c.HLines {
		lines = append(lines, h.Color)
	}
	for i, col := range lines {
		box, n := colourBox(img, col)
		if n < 200 {
			t.Errorf("line %d (%v): %d pixels of its colour, want a drawn line", i, col, n)
			continue
		}
		if box.Dx() < 800 {
			t.Errorf("line %d (%v) spans %v, want most of the width (plot and legend)", i, col, box)
		}
	}
	// The y axis starts at zero and the higher series is drawn higher:
	// the top of the 10k series (1600) is above the 1200 reference line.
	top10k, _ := colourBox(img, c.Series[0].Color)
	ref, _ := colourBox(img, c.HLines[0].Color)
	if top10k.Min.Y >= ref.Min.Y {
		t.Errorf("series top at y=%d, reference line at y=%d: want the series above", top10k.Min.Y, ref.Min.Y)
	}
	if out := os.Getenv("BENCHPLOT_SAMPLE"); out != "" {
		if err := sampleChart().WriteFile(filepath.Clean(out)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRenderSize(t *testing.T) {
	c := sampleChart()
	c.Width, c.Height = 640, 400
	img, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 640 || b.Dy() != 400 {
		t.Fatalf("size %v, want 640x400", b)
	}
}

func TestRenderErrors(t *testing.T) {
	if _, err := (Chart{}).Render(); err == nil {
		t.Error("empty chart: want an error")
	}
	bad := Chart{Series: []Series{{X: []float64{1, 2}, Y: []float64{1}}}}
	if _, err := bad.Render(); err == nil {
		t.Error("mismatched series: want an error")
	}
	neg := Chart{XLog2: true, Series: []Series{{X: []float64{0, 2}, Y: []float64{1, 2}}}}
	if _, err := neg.Render(); err == nil {
		t.Error("log axis with zero: want an error")
	}
	small := sampleChart()
	small.Width = -1
	if _, err := small.Render(); err == nil {
		t.Error("negative width: want an error")
	}
}
