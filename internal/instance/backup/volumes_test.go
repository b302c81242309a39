package backup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"testing"

	"github.com/pgpilot/pgpilot/internal/instance/backup/store"
	"github.com/pgpilot/pgpilot/internal/tools/testing/s3server"
)

// A base backup's data is stored in volumes of at most the volume size and read back
// whole, in order, whatever its size relative to that size: in a directory and in a real
// S3 server (where a volume larger than a part is a multipart upload).
func TestVolumes(t *testing.T) {
	srv := s3server.Start(t)
	srv.CreateBucket(t, "backups")
	stores := map[string]store.Store{
		"directory": mustStore(t, store.Config{Directory: t.TempDir()}),
		"s3": mustStore(t, store.Config{S3: &store.S3Config{Endpoint: srv.Endpoint, Bucket: "backups", Region: srv.Region,
			AccessKeyID: srv.AccessKeyID, SecretAccessKey: srv.SecretAccessKey}}),
	}
	for name, st := range stores {
		t.Run(name, func(t *testing.T) {
			// 20 MiB volumes hold more than one of the S3 store's 16 MiB parts.
			const size = 20 << 20
			for _, tc := range []struct {
				name    string
				bytes   int64
				volumes int
			}{
				{"empty", 0, 1},
				{"one byte", 1, 1},
				{"one short of a volume", size - 1, 1},
				{"exactly one volume", size, 1},
				{"one byte more", size + 1, 2},
				{"exactly two volumes", 2 * size, 2},
				{"two and a half", 2*size + size/2, 3},
			} {
				t.Run(tc.name, func(t *testing.T) {
					ctx := context.Background()
					id := "v-" + strconv.FormatInt(tc.bytes, 10)
					data := make([]byte, tc.bytes)
					for i := range data {
						data[i] = byte(i*7 + i/size)
					}
					n, err := putVolumes(ctx, st, id, CompressionZstd, bytes.NewReader(data), size)
					if err != nil || n != tc.volumes {
						t.Fatalf("putVolumes = %d, %v; want %d volumes", n, err, tc.volumes)
					}
					objs, err := st.List(ctx, dataPrefix(id, CompressionZstd))
					if err != nil {
						t.Fatal(err)
					}
					var keys []string
					for _, o := range objs {
						if o.Size > size {
							t.Errorf("%s holds %d bytes, more than a volume", o.Key, o.Size)
						}
						keys = append(keys, o.Key)
					}
					var want []string
					for i := range tc.volumes {
						want = append(want, dataKey(id, CompressionZstd, i))
					}
					if !slices.Equal(keys, want) {
						t.Errorf("stored %q, want %q", keys, want)
					}

					first, err := st.Get(ctx, dataKey(id, CompressionZstd, 0))
					if err != nil {
						t.Fatal(err)
					}
					r := &volumeReader{ctx: ctx, st: st, info: Info{ID: id, Volumes: n}, cur: first, next: 1}
					got, err := io.ReadAll(r)
					if err != nil || !bytes.Equal(got, data) {
						t.Errorf("read back %d bytes (%v), want the %d stored", len(got), err, len(data))
					}
					_ = r.Close()

					if err := deleteData(ctx, st, id); err != nil {
						t.Fatal(err)
					}
					if objs, err := st.List(ctx, dataPrefix(id, CompressionZstd)); err != nil || len(objs) > 0 {
						t.Errorf("after deleteData: %d objects left (%v)", len(objs), err)
					}
				})
			}

			t.Run("a missing volume fails the read", func(t *testing.T) {
				ctx := context.Background()
				id := "missing"
				data := make([]byte, 2*size+1)
				if _, err := putVolumes(ctx, st, id, CompressionZstd, bytes.NewReader(data), size); err != nil {
					t.Fatal(err)
				}
				if err := st.Delete(ctx, dataKey(id, CompressionZstd, 1)); err != nil {
					t.Fatal(err)
				}
				first, err := st.Get(ctx, dataKey(id, CompressionZstd, 0))
				if err != nil {
					t.Fatal(err)
				}
				r := &volumeReader{ctx: ctx, st: st, info: Info{ID: id, Volumes: 3}, cur: first, next: 1}
				defer r.Close()
				if _, err := io.Copy(io.Discard, r); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("reading with volume 2 of 3 missing: %v, want not found", err)
				}
			})

			t.Run("a failing source stores no further volume", func(t *testing.T) {
				ctx := context.Background()
				id := "failing"
				broken := errors.New("pg_basebackup died")
				src := io.MultiReader(bytes.NewReader(make([]byte, size+size/2)), errReader{broken})
				n, err := putVolumes(ctx, st, id, CompressionZstd, src, size)
				if !errors.Is(err, broken) {
					t.Fatalf("putVolumes = %d, %v; want the source's error", n, err)
				}
				objs, err := st.List(ctx, dataPrefix(id, CompressionZstd))
				if err != nil {
					t.Fatal(err)
				}
				if len(objs) != 1 || objs[0].Key != dataKey(id, CompressionZstd, 0) {
					t.Errorf("stored %+v, want only the first, complete volume (for the caller to delete)", objs)
				}
				_ = deleteData(ctx, st, id)
			})
		})
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func mustStore(t *testing.T, cfg store.Config) store.Store {
	t.Helper()
	st, err := store.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
