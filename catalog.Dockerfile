# The catalog image: opm serves the file-based catalog in catalog/ to OLM over gRPC
# (a CatalogSource of sourceType grpc). make catalog writes catalog/; make catalog-build
# builds this image, on an opm image (OPM_IMAGE in the Makefile) that has /bin/opm and
# /bin/grpc_health_probe, which OLM's catalog pods use as their probe.
ARG OPM_IMAGE
FROM ${OPM_IMAGE}

ENTRYPOINT ["/bin/opm"]
CMD ["serve", "/configs", "--cache-dir=/tmp/cache"]

COPY catalog /configs
# Build the serving cache now, so that the catalog pod starts without building it.
RUN ["/bin/opm", "serve", "/configs", "--cache-dir=/tmp/cache", "--cache-only"]

LABEL operators.operatorframework.io.index.configs.v1=/configs
