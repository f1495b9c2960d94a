package benchplot

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestGlyphsWellFormed(t *testing.T) {
	check := func(r rune, rows []string) {
		for i, row := range rows {
			if len(row) != glyphW {
				t.Errorf("glyph %q row %d: %d cells, want %d", r, i, len(row), glyphW)
			}
			for _, c := range row {
				if c != '#' && c != '.' {
					t.Errorf("glyph %q row %d: cell %q", r, i, c)
				}
			}
		}
	}
	for r, g := range glyphs {
		check(r, g[:])
	}
	for r, g := range descenders {
		check(r, g[:])
	}
}

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
		HLines: []HLine{{Name: "target: 0.8 x pgbench/2", Y: 1200, Color: Palette[2], Dashed: true}},
	}
}

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
	// Both series' colours must be somewhere in the picture.
	for _, s := range sampleChart().Series {
		found := false
		for y := 0; y < 600 && !found; y++ {
			for x := 0; x < 1280; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == s.Color.R && uint8(g>>8) == s.Color.G && uint8(b>>8) == s.Color.B {
					found = true
					break
				}
			}
		}
		if !found {
			t.Errorf("series %s not drawn", s.Name)
		}
	}
	if out := os.Getenv("BENCHPLOT_SAMPLE"); out != "" {
		if err := sampleChart().WriteFile(filepath.Clean(out)); err != nil {
			t.Fatal(err)
		}
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
}

func TestNiceScale(t *testing.T) {
	for _, tc := range []struct{ ymax, step, top float64 }{
		{1600, 500, 2000},
		{95, 20, 100},
		{0, 1, 1},
	} {
		step, top := niceScale(tc.ymax)
		if step != tc.step || top != tc.top {
			t.Errorf("niceScale(%g) = %g, %g; want %g, %g", tc.ymax, step, top, tc.step, tc.top)
		}
	}
}
