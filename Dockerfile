FROM python:3.11-slim
WORKDIR /app
# A plain (non-editable) install: the migrations ship inside the package (service.migrations).
COPY pyproject.toml setup.py README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-cache-dir . && python -m service model build-default
ENV PYTHONUNBUFFERED=1
EXPOSE 8000
CMD ["python", "-m", "service", "serve", "--host", "0.0.0.0", "--port", "8000"]
