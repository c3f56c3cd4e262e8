# nomadtf's task image: TensorFlow, nomadtf, and `nomadtf task` as what Nomad runs.
#
# For your registry (the official TensorFlow image as the base):
#     pip wheel --no-deps --wheel-dir wheels .
#     docker build -t registry.example.com/nomadtf:tf2.21.0 .
#     docker build -t registry.example.com/nomadtf:tf2.21.0-gpu --build-arg BASE=tensorflow/tensorflow:2.21.0-gpu .
# then set driver.image (and driver.gpu_image) in job.json. `nomadtf dev image build` builds
# this same file on a base made from Debian's packages, for the local stack.
#
# The build context is wheels/ and examples/ only (.dockerignore).
ARG BASE=tensorflow/tensorflow:2.21.0

FROM ${BASE} AS build
# A requirement such as tensorflow-cpu==2.21.0 where BASE has no TensorFlow; empty: BASE's.
ARG TENSORFLOW=
# What the examples' code imports besides TensorFlow, and TensorBoard for the tensorboard role
# (recent TensorFlow releases no longer install it); your code's own packages go here too.
ARG EXTRA_REQUIREMENTS="scikit-learn tensorboard"
# 1: install from wheels/ alone (a build without a package index, as `dev image build` runs).
ARG PIP_NO_INDEX=
COPY wheels/ /tmp/wheels/
# A virtual environment that sees BASE's packages (its TensorFlow, its CUDA libraries), so
# nomadtf's dependencies never replace them.
RUN python3 -m venv --system-site-packages /opt/nomadtf/venv \
 && PIP_NO_INDEX="${PIP_NO_INDEX}" /opt/nomadtf/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --find-links /tmp/wheels /tmp/wheels/nomadtf-*.whl ${TENSORFLOW} ${EXTRA_REQUIREMENTS}

# Only the environment travels into the image: no wheelhouse layer.
FROM ${BASE}
COPY --from=build /opt/nomadtf/venv /opt/nomadtf/venv
COPY examples/ /opt/nomadtf/examples/
ENV PATH=/opt/nomadtf/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1
WORKDIR /opt/nomadtf
LABEL org.opencontainers.image.title="nomadtf task" \
      org.opencontainers.image.description="TensorFlow and nomadtf: Nomad runs python3 -m nomadtf task --role ROLE"
# What the jobs nomadtf renders run (they name it as the entrypoint too, so an image built
# elsewhere with nomadtf on PATH works the same).
ENTRYPOINT ["python3", "-m", "nomadtf", "task"]
