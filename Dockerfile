FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-cache-dir . && python -m service model build-default
EXPOSE 8000
CMD ["python", "-m", "service", "serve", "--host", "0.0.0.0", "--port", "8000"]
